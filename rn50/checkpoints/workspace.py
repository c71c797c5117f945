"""The workspace: the folder of a run (--workspace) and the prefix of its files (--model-prefix), with the path
of every file the recipe writes there and the operations on them. One object, built once from the flags:

    workspace = Workspace.of(args)                        # args.workspace, args.model_prefix
    workspace.last_state, workspace.previous_state        # <prefix>_last.state, <prefix>_prev.state
    workspace.best_params, workspace.ema_best_params      # <prefix>_best.params, <prefix>_ema_best.params
    workspace.epoch_params(epoch)                         # <prefix>_NNNN.params
    workspace.int8_prefix                                 # <prefix>_int8-symbol.json, -0000.params, .json
    workspace.export_folder                               # export/ (--mode export's files)
    workspace.report(args.mode)                           # report.json, or report_<mode>.json
    workspace.review_page(args.mode)                      # report.html, or report_<mode>.html
    workspace.training_batch                              # train_batch.jpg
    workspace.classes                                     # classes.json, the class names of its model
    workspace.place(args.log)                             # an output path a flag gives: absolute, or in here
    workspace.prune_epoch_params(args.keep_checkpoints)   # after each new <prefix>_NNNN.params
    workspace.clean()                                     # what a run killed during a write left

The files (their formats: checkpoint.py), all written atomically (files.atomic_path):

* `<prefix>_last.state`: everything an exact resume needs; each new one keeps the one it replaces as
  `<prefix>_prev.state`, the fallback if the last is damaged.
* `<prefix>_best.params` (the best validated weights), `<prefix>_NNNN.params` (--save-frequency; --keep-checkpoints
  N keeps the newest N), `<prefix>_ema_best.params` (--model-ema: the weight average on its own best top-1).
* `<prefix>_int8-*` (--quantize int8: the calibrated model, cached), `export/` (--mode export).
* `report.json` (training's) and `report_<mode>.json` (the other modes'), `report.html` and `report_val.html` (the
  review's page, rn50/review/), `train_batch.jpg` (the first training batch), `classes.json` (the class names of
  the model: val, pred, export and the review read them beside the weights), and the outputs named by flags
  relative to the workspace (--log, --tensorboard, --mlperf-log).
"""
import dataclasses
import logging
import os
import re

from rn50 import files

log = logging.getLogger(__name__)

TRAINING_MODES = ('train', 'train_val')


@dataclasses.dataclass(frozen=True)
class Workspace:
    """The folder of a run and the prefix of its checkpoint files."""
    folder: str
    prefix: str = 'model'

    @classmethod
    def of(cls, args):
        return cls(args.workspace, args.model_prefix)

    def place(self, path):
        """`path` as given when absolute, else inside the folder."""
        return os.path.join(self.folder, path)

    @property
    def last_state(self):
        return self.place(f'{self.prefix}_last.state')

    @property
    def previous_state(self):
        return self.place(f'{self.prefix}_prev.state')

    @property
    def best_params(self):
        return self.place(f'{self.prefix}_best.params')

    @property
    def ema_best_params(self):
        return self.place(f'{self.prefix}_ema_best.params')

    def epoch_params(self, epoch):
        return self.place(f'{self.prefix}_{epoch:04d}.params')

    @property
    def int8_prefix(self):
        return self.place(f'{self.prefix}_int8')

    @property
    def export_folder(self):
        return self.place('export')

    def report(self, mode):
        """report.json is the training run's; the other modes write report_<mode>.json beside it, so a
        validation or an export in a training workspace never replaces the training report."""
        return self.place('report.json' if mode in TRAINING_MODES else f'report_{mode}.json')

    def review_page(self, mode):
        """report.html, the training run's review (rn50/review/), or report_<mode>.html (--mode val's)."""
        return self.place('report.html' if mode in TRAINING_MODES else f'report_{mode}.html')

    @property
    def classes(self):
        """classes.json: the class names of the run's model, kept with it (data/classes.py keep_with_run)."""
        return self.place('classes.json')

    @property
    def training_batch(self):
        """train_batch.jpg: the first training batch of the run after augmentation, drawn once."""
        return self.place('train_batch.jpg')

    def prune_epoch_params(self, keep):
        """--keep-checkpoints N: delete all but the newest N `<prefix>_NNNN.params` of the folder (by epoch
        number; 0 keeps all). Called after a new one is written (atomically), so a crash at any moment leaves
        at least the N newest."""
        if not keep:
            return
        pattern = re.compile(re.escape(self.prefix) + r'_([0-9]{4,})\.params$')
        epochs = sorted(int(m.group(1)) for m in map(pattern.match, os.listdir(self.place('.'))) if m)
        for epoch in epochs[:-keep]:
            os.remove(self.epoch_params(epoch))
            log.info('Removed %s (--keep-checkpoints %d)', self.epoch_params(epoch), keep)

    def clean(self):
        """Remove the half-written temporaries of a run killed during a write (its outputs only)."""
        removed = files.remove_stale_temporaries(self.place('.'), (f'{self.prefix}_', 'report', 'train_batch.jpg',
                                                                   'classes.json'))
        if removed:
            log.info('Removed %d temporary files left by an interrupted write: %s', len(removed), ', '.join(removed))
