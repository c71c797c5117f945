"""A training run's checkpoints, in one object (as timm's CheckpointSaver): what a state holds, when each file is
written and which of them are kept, and how a run starts from a state and continues it. Over the workspace's files
(workspace.py), their formats (checkpoint.py) and the resume policy (resume.py):

    saver = Saver(workspace, world, CheckpointPolicy.of(args, resumed))   # fit.train, once; resumed: what a resume keeps
    state = saver.start(net)                     # the State to resume (its weights in `net`) or None, agreed
    progress = saver.resume(net, step, state)    # its optimizer state, loss scaler, statistics; its Progress
    progress = Progress(epoch=0)                 # ... or that of a new run
    saver.save_epoch(net, epoch, metrics, progress, writer)        # <prefix>_NNNN.params, <prefix>_best.params
    saver.save_best_average(net, epoch, accuracy, progress, writer)   # <prefix>_ema_best.params (--model-ema)
    saver.write_state(net, step, progress, statistics, average, writer)   # <prefix>_last.state, the previous kept

A state holds the arrays (checkpoint.py's format) and a 'meta' dictionary: the run's Progress, the record of
where it stands, which the epoch loop advances, and what the Saver adds as it writes (the step's seed and loss
scaler, the global batch, the number of workers, the run's settings, its preprocessing).

`step` is the training step (rn50/training/step.py): its `gluon_trainer`, `seed`, `scaler_state()` and
`restore_scaler(state)`. What else a state holds comes in as values: the workers' batchnorm statistics
(checkpoint.worker_statistics) and the weight average's arrays (ema.average_state), both collectives the caller
makes on every worker. `writer`: a checkpoint.BackgroundWriter, or None to write at once. A --benchmark-iters
run is a measurement: it writes no file, and resumes none (resume.training_start).
"""
import dataclasses
import logging
import os

from rn50.checkpoints import checkpoint
from rn50.checkpoints import optimizer_state
from rn50.checkpoints import resume

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Progress:
    """Where a training run stands, as its states record it in their 'meta': in epoch `epoch`, `iteration`
    batches into it (0: not started); the best top-1 validated (`best_accuracy`; `ema_best_accuracy` of
    --model-ema's average, None until one); every finished epoch's metrics (`history`, dicts with 'epoch'); the
    sum and count of the epoch's finite losses so far (`loss_sum`, `loss_count`: rank 0's hold every worker's once
    written); the run's `seed`; its training wall time over all its resumes (`wall_seconds`, None until
    measured). The epoch loop advances it; the Saver writes it (meta) and reads it back (of_meta)."""
    epoch: int = 0
    iteration: int = 0
    best_accuracy: float = None
    history: list = dataclasses.field(default_factory=list)
    loss_sum: float = 0.0
    loss_count: int = 0
    seed: int = None
    wall_seconds: float = None
    ema_best_accuracy: float = None

    @classmethod
    def of_meta(cls, meta):
        """The Progress a state's `meta` records (what it lacks, a state of an earlier version, as a new run's)."""
        return cls(**{field.name: meta[field.name] for field in dataclasses.fields(cls) if field.name in meta})

    def meta(self):
        """The fields as a state's meta records them (the measures not taken yet left out)."""
        return {name: value for name, value in dataclasses.asdict(self).items()
                if value is not None or name not in ('wall_seconds', 'ema_best_accuracy')}

    def finish_epoch(self, metrics):
        """The epoch done: its `metrics` in the history, the position at the start of the next one."""
        self.history.append(dict(metrics, epoch=self.epoch))
        self.epoch, self.iteration, self.loss_sum, self.loss_count = self.epoch + 1, 0, 0.0, 0


@dataclasses.dataclass(frozen=True)
class CheckpointPolicy:
    """What the flags say of a training run's checkpoints (`of`): where it starts from (`start`, a
    resume.TrainingStart), --save-frequency, --keep-checkpoints (`keep`), the global batch and the --wd and --mom
    a resume takes (the flags win over the state's), and the input preprocessing its states record for val, pred
    and export."""
    start: resume.TrainingStart
    save_frequency: int = -1
    keep: int = 0
    global_batch: int = 192
    weight_decay: float = 0.0
    momentum: float = 0.0
    preprocessing: dict = None

    @classmethod
    def of(cls, args, resumed):
        """`resumed`: the flags a resumed run must keep (fit.RESUMED_SETTINGS: each concern's record names its)."""
        preprocessing = {'rgb_mean': list(args.rgb_mean), 'rgb_std': list(args.rgb_std),
                         'image_shape': list(args.image_shape), 'input_layout': args.input_layout,
                         'data_val_resize': args.data_val_resize,
                         'val_image_shape': list(args.val_image_shape or args.image_shape)}
        return cls(start=resume.TrainingStart.of(args, resumed), save_frequency=args.save_frequency,
                   keep=args.keep_checkpoints,
                   global_batch=args.batch_size, weight_decay=args.wd, momentum=args.mom, preprocessing=preprocessing)


class Saver:
    """The checkpoints of one training run in `workspace` (a Workspace), for this worker of `world`, by `policy`
    (a CheckpointPolicy)."""

    def __init__(self, workspace, world, policy):
        self.workspace, self.world, self.policy = workspace, world, policy

    @property
    def measuring(self):
        """A --benchmark-iters measurement: no state written, none resumed."""
        return self.policy.start.measuring

    def start(self, net):
        """The State to resume (its weights already in `net`), or None for a new run; the same on every worker
        (resume.agreed_training_start, a collective)."""
        return resume.agreed_training_start(self.workspace, self.policy.start, net, self.world)

    def resume_note(self):
        """What a stopped run leaves for the next one: a --benchmark-iters run writes no state."""
        if self.measuring:
            return ' (a measurement: no state was written, the next run starts afresh)'
        return f'; the next run resumes from {self.workspace.last_state}'

    # ------------------------------------------------------------------------------------------------------
    # Continuing a state

    def resume(self, net, step, state):
        """Continue a saved run (a checkpoint.State): its optimizer state (with this run's --wd and --mom), loss
        scaler, this worker's batchnorm statistics; returns its Progress, with the loss sums (rank 0's) and the
        position in images seen (its seed: fit.resumed_seed)."""
        meta, start = state.meta, self.policy.start
        progress = Progress.of_meta(meta)
        if start.load and start.load.endswith('.state') and not start.finetune and \
                os.path.dirname(os.path.abspath(start.load)) != os.path.abspath(self.workspace.folder):
            # A run continued from another workspace's state: its best weights stay there, and this workspace
            # gets a model_best.params of its own epochs (else pred here took the last state without a word).
            log.info('Continuing the run of %s in this workspace: the best checkpoint here is that of the epochs '
                     'trained here (the earlier best, top-1 %s, stays in %s)', start.load, meta.get('best_accuracy'),
                     os.path.dirname(os.path.abspath(start.load)))
            progress.best_accuracy = progress.ema_best_accuracy = None
            for entry in progress.history:   # the summary leaves them out (training/history.py)
                entry.setdefault('inherited_from', os.path.dirname(os.path.abspath(start.load)))
        optimizer_state.restore_trainer_state(step.gluon_trainer, state.trainer)
        optimizer_state.take_flags(step.gluon_trainer._optimizer, wd=self.policy.weight_decay,
                                   mom=self.policy.momentum)
        step.restore_scaler(meta.get('loss_scaler'))
        checkpoint.restore_worker_statistics(net, self.world, state.worker_statistics, meta.get('workers', 1))
        if self.world.rank != 0:
            progress.loss_sum, progress.loss_count = 0.0, 0
        batch = self.policy.global_batch
        saved_batch = meta.get('global_batch', batch)
        if saved_batch != batch and progress.iteration:
            images = progress.iteration * saved_batch
            progress.iteration = images // batch
            log.warning('Resuming with a global batch of %d (the state was written with %d): continuing at '
                        'iteration %d of epoch %d, after the same %d images; the batches differ from an '
                        'uninterrupted run', batch, saved_batch, progress.iteration, progress.epoch,
                        progress.iteration * batch)
        return progress

    # ------------------------------------------------------------------------------------------------------
    # Writing

    def save_epoch(self, net, epoch, metrics, progress, writer=None):
        """<prefix>_NNNN.params every --save-frequency epochs (the newest --keep-checkpoints kept) and
        <prefix>_best.params on a new best top-1 (progress.best_accuracy), written by `writer` from copies made
        now; none for a --benchmark-iters measurement."""
        if self.world.rank != 0 or self.policy.save_frequency == 0 or self.measuring:
            return
        workspace, frequency = self.workspace, self.policy.save_frequency
        if frequency > 0 and (epoch + 1) % frequency == 0:
            path = workspace.epoch_params(epoch)
            checkpoint.save_params(net, path, writer)
            checkpoint.run_or_submit(lambda: workspace.prune_epoch_params(self.policy.keep), writer)
            log.info('[Epoch %d] Saving %s', epoch, path)
        accuracy = metrics.get('val.accuracy')
        if accuracy is not None and (progress.best_accuracy is None or accuracy > progress.best_accuracy):
            progress.best_accuracy = accuracy
            path = workspace.best_params
            checkpoint.save_params(net, path, writer)
            log.info('[Epoch %d] Saving %s with accuracy %.4f', epoch, path, accuracy)

    def save_best_average(self, net, epoch, accuracy, progress, writer=None):
        """<prefix>_ema_best.params (rank 0) when the weight average, swapped into `net` now, reaches a new best
        top-1 (`accuracy`; progress.ema_best_accuracy on every worker)."""
        best = progress.ema_best_accuracy
        if accuracy is not None and (best is None or accuracy > best):
            progress.ema_best_accuracy = accuracy
            if self.world.rank == 0 and self.policy.save_frequency != 0:
                path = self.workspace.ema_best_params
                checkpoint.save_params(net, path, writer)
                log.info('[Epoch %d] Saving %s with accuracy %.4f', epoch, path, accuracy)

    def write_state(self, net, step, progress, statistics=None, average=None, writer=None):
        """<prefix>_last.state (rank 0 writes it, with every worker's batchnorm `statistics` and the weight
        `average`'s arrays, by `writer` from copies made now), the one it replaces kept as <prefix>_prev.state:
        `progress` (a Progress) with the step's seed and loss scaler, the global batch, the workers, the run's
        settings and its preprocessing."""
        if self.world.rank != 0:
            return
        meta = dict(progress.meta(), seed=step.seed, loss_scaler=step.scaler_state(),
                    global_batch=self.policy.global_batch, workers=self.world.size,
                    settings=self.policy.start.settings, preprocessing=self.policy.preprocessing)
        checkpoint.save_state(self.workspace.last_state, net, step.gluon_trainer, meta,
                              previous=self.workspace.previous_state, worker_statistics=statistics, extra=average,
                              writer=writer)
