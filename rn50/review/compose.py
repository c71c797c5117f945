"""A review of what a model learned, put together: the figures of a validation pass's outcomes (outcomes.py) with
the files of the worst images, the pictures (pictures.py, examples.py) and the page (page.py). The composers call
it at the end of a training run (the weights it keeps as best) and of --mode val:

    subject = Subject.of(args, names)                      # the composer's record
    review = review_run(subject, workspace.review_page(args.mode), table, trained, history, reader.prepare,
                        workspace.training_batch)          # writes report.html; report.json's "review"

What costs time here (the figures, the pictures, reading 16 records) comes after training; docs/performance.md
measures it.
"""
import dataclasses
import logging
import os

from rn50 import flags
from rn50.data import records
from rn50.data.contract import Images
from rn50.reports import logs
from rn50.review import examples, outcomes, page, pictures

log = logging.getLogger(__name__)

WORST_IMAGES = 16


def add_args(parser):
    group = parser.add_argument_group('Review', 'what the model learned: report.html (train_val, train) and '
                                      'report_val.html (val), with their figures in report.json / report_val.json')
    group.add_argument('--review-worst', type=flags.integer(minimum=0), default=WORST_IMAGES,
                       help='how many of the validation images of highest loss the review shows (0: none)')
    group.add_argument('--no-review', action='store_true',
                       help='end the run without its review (no report.html or report_val.html, no "review" in '
                            'the report, no validation pass of the best weights after training)')
    return group


@dataclasses.dataclass(frozen=True)
class Subject:
    """What a review is of, as values (`of`): the class `names`, the validation files (`val`: .rec, .idx), the
    `images` the network takes (contract.Images), how many of the worst images it shows (`worst`, --review-worst),
    and for its page: the run's `mode`, its `workspace` folder, the `network` in words, its DLLogger file
    (`dllogger`, the curves' source) and its resolved flags (`config`)."""
    names: tuple
    val: tuple = (None, '')
    images: Images = Images()
    worst: int = WORST_IMAGES
    mode: str = 'val'
    workspace: str = '.'
    network: str = ''
    dllogger: str = None
    config: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, args, names):
        return cls(names=tuple(names), val=(args.data_val, args.data_val_idx), images=Images.of(args),
                   worst=args.review_worst, mode=args.mode, workspace=os.path.abspath(args.workspace),
                   network=f'{args.arch} {args.num_layers}, {args.num_classes} classes',
                   dllogger=os.path.join(args.logdir or args.workspace, args.dllogger_log), config=dict(vars(args)))

    @property
    def training(self):
        return self.mode in ('train', 'train_val')


def review_run(subject, page_path, table, trained, history=(), prepare=None, training_batch=None):
    """Write the page of a run's review to `page_path` and return report.json's "review" (None without a `table`,
    the gathered outcomes of the weights `trained`, a resume.TrainedWeights, with the epoch that made them best;
    `prepare`: pred's preprocessing of an encoded image), with the curves of `history` and the DLLogger file and
    the `training_batch` picture (a file) of a training run. Rank 0's work. A review that fails is a warning: the
    run's results stand without it."""
    try:
        return write_review(subject, page_path, table, trained, history, prepare, training_batch)
    except Exception as e:  # whatever breaks the review (a file, a library), the run's own results are written
        log.debug('review', exc_info=True)
        log.warning('No review of this run (%s: %s); its results are in %s', type(e).__name__,
                    str(e).splitlines()[0][:300] if str(e) else '', os.path.dirname(page_path))
        return None


def write_review(subject, page_path, table, trained, history, prepare, training_batch):
    """review_run's work."""
    review, images = None, {}
    if table is not None:
        review, images = validation_review(subject, table, prepare)
        review.update(weights=trained.path, epoch=trained.last_epoch)
    if subject.training:
        images['curves'] = training_curves(subject.dllogger, history)
        if training_batch and os.path.exists(training_batch):
            with open(training_batch, 'rb') as f:
                images['training_batch'] = f.read()
    facts = [('workspace', subject.workspace), ('mode', subject.mode), ('network', subject.network),
             ('weights', f'{trained.path}: {trained.words}')]
    if review:
        facts.append(('validation', f'{review["images"]} images: top-1 {100 * review["top1"]:.2f}%, top-5 '
                                    f'{100 * review["top5"]:.2f}%, loss {review["loss"]:.4f}'))
    page.write_page(page_path, page.Page(f'ResNet review: {os.path.basename(subject.workspace)}', tuple(facts), review,
                                         images, subject.config, logs.library_versions(), logs.hardware()))
    log.info('What the model learned (per class, confusion, worst images, calibration%s): %s',
             ', curves' if 'curves' in images else '', page_path)
    return review


def validation_review(subject, table, prepare):
    """(report.json's "review", {picture name: bytes or None}) of a gathered outcomes.OutcomeTable: the figures,
    the worst images with their files (and shown through `prepare(encoded, name)`, pred's preprocessing), the
    confusion matrix (up to pictures.MATRIX_CLASSES classes), the per-class accuracy histogram and the
    reliability diagram."""
    review = outcomes.review_figures(table, list(subject.names), subject.worst)
    rec, idx = subject.val
    validation = records.RecordFile(rec, idx, len(subject.names), 'validation')
    names = examples.file_names(validation)
    if not names:
        log.info('%s has no .lst beside it: the worst images are named by their record position', rec)
    for worst in review['worst']:
        worst['file'] = names.get(worst['record'])
    images = {'class_accuracy': pictures.drawn('the per-class accuracy', pictures.class_accuracy_png,
                                               [c['top1'] for c in review['per_class']]),
              'reliability': pictures.drawn('the reliability diagram', pictures.reliability_png,
                                            review['calibration'])}
    if len(subject.names) <= pictures.MATRIX_CLASSES:
        images['confusion'] = pictures.drawn('the confusion matrix', pictures.confusion_png,
                                             outcomes.confusion_matrix(review), list(subject.names))
    if review['worst']:
        images['worst'] = pictures.drawn('the worst images', worst_sheet, review['worst'], validation, prepare,
                                         subject.images)
    return review, images


def worst_sheet(worst, validation, prepare, images):
    """The sheet of the worst images: each as validation crops it, captioned with its file, true and predicted
    class and their probabilities."""
    tiles = examples.validation_crops(validation, [w['record'] for w in worst], prepare, images)
    captions = [[os.path.basename(w['file']) if w['file'] else f'record {w["record"]}',
                 f'true: {w["true_name"]} {100 * w["true_probability"]:.1f}%',
                 f'pred: {w["predicted_name"]} {100 * w["predicted_probability"]:.1f}%'] for w in worst]
    return pictures.sheet_jpeg(tiles, captions)


def training_curves(dllogger_path, history):
    """The curves' PNG (or None) from the run's own DLLogger file (its logged windows: loss, learning rate; the
    records a resumed run superseded left out) and `history` (the per-epoch metrics of every part of the run)."""
    steps = []
    if dllogger_path and os.path.exists(dllogger_path):
        windows = {}
        for record in logs.read_dllogger(dllogger_path):
            step = record['step']
            if isinstance(step, list) and len(step) == 2:
                windows[tuple(step)] = record['data']
        batches = max((iteration for _, iteration in windows), default=1)
        steps = [(epoch + iteration / batches, data) for (epoch, iteration), data in sorted(windows.items())]
    if not steps and not history:
        return None
    return pictures.drawn('the curves', pictures.curves_png, steps, history)
