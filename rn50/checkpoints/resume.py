"""Which checkpoint a run starts from, and which weights a mode uses: the resume policy. The files are the
workspace's (workspace.py), their formats checkpoint.py's; the Saver (saver.py) starts and continues a training
run with it.

    resume.check_weights_source('val', workspace, load, finetune, teacher)   # train.py, before anything is written
    path = resume.find_weights(workspace, load)       # --load, else the best, else the last state
    path = resume.inference_weights(workspace, load)  # the same, logged with why: val, pred, INT8, export
    start = resume.TrainingStart.of(args, resumed)    # what a training run starts from, as the flags say
    state = resume.agreed_training_start(workspace, start, net, world)   # the State to resume (its weights
                                                      # already in `net`) or None, the same on every worker
    settings = resume.run_settings(args, resumed)     # what a state records of its run (meta['settings'])
    resume.check_same_run(start, state.meta, path)    # RecipeError when the command's settings differ

One rule (training_start): the workspace's last state is resumed when it exists, whatever --load names; only
--load of a .state file (without --finetune) resumes that state instead; else --load gives the weights of a
new run (with --finetune every layer but a classifier of another width), else the fresh initialisation
stays. A damaged last state is an error naming the previous one; resuming from that one sets the damaged
one aside (set_aside_if_damaged).
"""
import dataclasses
import json
import logging
import os
import re

from rn50.checkpoints import checkpoint
from rn50.checkpoints import weight_conversion
from rn50.checkpoints import weight_loading
from rn50.data import contract
from rn50.errors import RecipeError

log = logging.getLogger(__name__)


def find_weights(workspace, load=None):
    """The checkpoint evaluation and prediction use: `load` (--load), else the `workspace`'s best, else its last
    state."""
    candidates = [load] if load else [workspace.best_params, workspace.last_state]
    for path in candidates:
        if os.path.exists(path):
            return path
    raise RecipeError(f'no trained weights: {" or ".join(candidates)} not found. Pass --load with a weights '
                      'file (this mode refuses to run on random weights)')


def inference_weights(workspace, load=None):
    """find_weights for val, pred, INT8 and export, logged with why that file (a workspace without a best
    checkpoint falls back on its last state, which the user should know) and what it is (describe_weights: a
    warning for weights from the middle of an epoch)."""
    path = find_weights(workspace, load)
    best = workspace.best_params
    if load:
        why = '--load'
    elif path == best:
        why = 'the best validated weights of the workspace'
    else:
        why = (f'the workspace\'s last state: there is no {os.path.basename(best)} (no validation '
               'ran, or none beat the best of the run this one continued)')
    trained = describe_weights(path)
    log.info('Weights: %s (%s): %s', path, why, trained.words)
    if not trained.finished:
        log.warning('These weights are not a finished epoch: the run stopped %d iterations into epoch %d (%s): a model '
                    'in the middle of its training, not the one the run will give', trained.iteration, trained.epoch,
                    f'{trained.epoch} of {trained.epochs} epochs done' if trained.epochs else
                    f'{trained.epoch} epochs done')
    return path


@dataclasses.dataclass(frozen=True)
class TrainedWeights:
    """What a weights file is (describe_weights): `kind` ('state': a run's last state; 'best': the best validated
    weights; 'epoch': <prefix>_NNNN.params; 'weights': any other file), the `epoch`s done (a state's epoch
    counter; the epochs a .params file was saved after), the `iteration` it reached in the next (0: a finished
    epoch), the `epochs` of its schedule, and the top-1 `accuracy` it was validated at (best)."""
    path: str
    kind: str = 'weights'
    epoch: int = None
    iteration: int = 0
    epochs: int = None
    accuracy: float = None

    @property
    def finished(self):
        return self.iteration == 0

    @property
    def last_epoch(self):
        """The epoch the weights finished last, counted from 0 as report.json's epochs (None: unknown, or none)."""
        return self.epoch - 1 if self.epoch else None

    @property
    def words(self):
        schedule = f' of {self.epochs}' if self.epochs else ''
        if self.kind == 'state':
            return f'a training state, {self.epoch}{schedule} epochs done' + (
                f' and {self.iteration} iterations into epoch {self.epoch} (counted from 0, as the log does)'
                if self.iteration else '')
        if self.kind == 'best':
            return 'the best validated weights' + (f', after {self.epoch}{schedule} epochs (top-1 {self.accuracy:.4f})'
                                                   if self.epoch is not None else '')
        if self.kind == 'epoch':
            return f'the weights after {self.epoch}{schedule} epochs'
        return 'weights of another origin (no record of their training)'

    def record(self):
        """For report_export.json and pred's JSON: the file, what it is, and whether it is a finished epoch."""
        return dict(dataclasses.asdict(self), finished=self.finished, words=self.words)


def describe_weights(path):
    """The TrainedWeights of `path`: a .state's own epoch and iteration (read from it); a best .params file's epoch
    and top-1 from the report.json beside it; a <prefix>_NNNN.params file's epoch from its name; the run's epochs
    from that report. Anything unreadable leaves the value unknown."""
    folder, name = os.path.split(os.path.abspath(path))
    report = {}
    try:
        with open(os.path.join(folder, 'report.json')) as f:
            report = json.load(f)
    except (OSError, ValueError):
        pass
    epochs = (report.get('config') or {}).get('num_epochs')
    if name.endswith('.state'):
        try:
            meta = checkpoint.read_state(path).meta
        except RecipeError:
            return TrainedWeights(path, 'state', epochs=epochs)
        return TrainedWeights(path, 'state', meta.get('epoch'), meta.get('iteration') or 0,
                              (meta.get('settings') or {}).get('num_epochs') or epochs)
    numbered = re.fullmatch(r'.+_([0-9]{4,})\.params', name)
    if name.endswith('_best.params'):
        validated = [e for e in report.get('epochs') or [] if e.get('val.accuracy') is not None
                     and 'inherited_from' not in e]
        best = max(validated, key=lambda e: e['val.accuracy'], default=None)
        return TrainedWeights(path, 'best', None if best is None else best['epoch'] + 1, 0, epochs,
                              None if best is None else best['val.accuracy'])
    if numbered:
        return TrainedWeights(path, 'epoch', int(numbered.group(1)) + 1, 0, epochs)   # NNNN counts from 0
    return TrainedWeights(path)


def set_aside_if_damaged(path):
    """Rename a damaged state to `<path>.damaged` (kept for inspection), so that the next save, which keeps
    the state it replaces as the previous one (the fallback), finds none to keep. Used when a run resumes
    from another state, e.g. --load model_prev.state after the error naming it. Several processes may do it
    at once on one file (the workers of a run on a shared workspace): one moves it, the others find it gone."""
    try:
        checkpoint.read_state(path)
    except RecipeError as e:
        try:
            os.replace(path, path + '.damaged')
        except FileNotFoundError:
            log.info('%s was set aside by another worker', path)
            return
        log.warning('%s; moved it to %s.damaged so that it never becomes the fallback', e, path)


@dataclasses.dataclass(frozen=True)
class TrainingStart:
    """What a training run starts from, as the flags say (`of`): `load` (--load: weights, or a state to resume),
    `finetune`, `measuring` (a --benchmark-iters run resumes nothing), the run's `settings` (run_settings of the
    flags `resumed` names: a resumed state must have the same), its data `backend`, and the input normalisation
    (`mean`, `std`) loaded weights are compared with."""
    load: object = None
    finetune: bool = False
    measuring: bool = False
    settings: dict = None
    resumed: tuple = ()
    backend: str = None
    mean: tuple = (123.68, 116.779, 103.939)
    std: tuple = (58.393, 57.12, 57.375)

    @classmethod
    def of(cls, args, resumed):
        """`resumed`: the flags that change a run's result (fit.RESUMED_SETTINGS)."""
        return cls(load=args.load, finetune=args.finetune, measuring=bool(args.benchmark_iters),
                   settings=run_settings(args, resumed), resumed=tuple(resumed), backend=args.data_backend,
                   mean=tuple(args.rgb_mean), std=tuple(args.rgb_std))


def agreed_training_start(workspace, start, net, world):
    """training_start on every worker of `world`, which must all start from rank 0's choice (the same state
    file content, epoch, iteration and seed, or all a new run), else every worker stops with the same error:
    each worker reads its own --workspace and --load, so a resume needs them on a filesystem the nodes share.
    A worker that fails alone would leave the others waiting in a collective: the outcome is agreed first."""
    failure = state = None
    try:
        state = training_start(workspace, start, net, set_aside=world.rank == 0)
    except RecipeError as e:
        failure = e
    own = start_fingerprint(state)
    # One all-reduce: how many workers failed, and rank 0's choice (a broadcast, as in workers.World).
    totals = world.comm.allreduce_sum([failure is not None] + (own if world.rank == 0 else [0] * len(own)))
    failed, chosen = int(totals[0]), [int(value) for value in totals[1:]]
    if failure is not None:
        raise failure
    if failed:
        raise RecipeError(f'{failed} of {world.size} workers could not open the checkpoint this run starts from (their '
                          f'error is above): {SHARED_WORKSPACE_RULE}')
    others = int(world.comm.allreduce_sum([own != chosen])[0])
    if others:
        last = os.path.basename(workspace.last_state)
        what = (f'resumes from its {last} or --load state at epoch {chosen[1]}, '
                f'iteration {chosen[2]}' if chosen[0] else 'starts a new run (no state in its workspace)')
        raise RecipeError(f'the workers would not start from the same state: worker 0 {what}, and {others} of the '
                          f'{world.size} workers see another state or none. {SHARED_WORKSPACE_RULE}')
    return state


SHARED_WORKSPACE_RULE = ('Every worker reads the state to resume from its own --workspace (and --load), so with '
                         'several nodes the workspace must be on a filesystem they share, at the same path on '
                         'every node (the default ./ is usually node-local): e.g. --workspace /shared/runs/rn50')


def start_fingerprint(state):
    """What every worker must agree on before training: [resumes, epoch, iteration, seed + 1, the first 52
    bits of the state's checksum] (all zero for a new run); integers a float64 all-reduce keeps exactly."""
    if state is None:
        return [0, 0, 0, 0, 0]
    seed = state.meta.get('seed')
    return [1, state.meta['epoch'], state.meta['iteration'], 0 if seed is None else seed + 1,
            int(state.checksum[:13], 16)]


# The backends whose validation resize has each interpolation (rn50/data/validation_resize.py)
BACKENDS_OF = {'linear': '--data-backend mxnet', 'linear-antialias': '--data-backend dali-cpu or dali-gpu'}


def run_settings(args, resumed):
    """What a state records of its run (meta['settings']): the flags `resumed` names (what changes a run's result,
    as each concern's record names it: fit.RESUMED_SETTINGS), as JSON values (tuples as lists; the training data
    as an absolute path), the rate and global batch, and the validation's resize."""
    settings = {name: getattr(args, name, None) for name in resumed}
    settings = {name: list(value) if isinstance(value, tuple) else value for name, value in settings.items()}
    if 'data_train' in settings:
        settings['data_train'] = None if args.data_backend == 'synthetic' or not args.data_train else \
            os.path.abspath(args.data_train)
    settings['lr'], settings['global_batch'] = args.lr, args.batch_size
    settings['data_val_resize'] = args.data_val_resize     # what val, pred and export take (trained_settings.py)
    settings['val_image_shape'] = list(args.val_image_shape) if args.val_image_shape else None
    # the validation resize's: the weights' run's, else the backend's
    settings['val_interpolation'] = contract.interpolation(getattr(args, 'val_interpolation', None), args.data_backend)
    return settings


def check_same_run(start, meta, path):
    """RecipeError listing every setting in which this command (`start`, a TrainingStart) differs from the run whose
    state `path` is (a workspace holds one run: resuming another's state would train it with the wrong settings,
    or not at all). A setting a state does not record (one written before the recipe recorded it) is not
    checked."""
    saved, now = meta.get('settings'), start.settings
    if saved is None:
        return
    unrecorded = [name for name in start.resumed if name not in saved]
    if unrecorded:   # a state of a version that did not record them yet (--mixup-mode, --auto-augment-fill, ...)
        log.info('%s does not record %s (written before the recipe recorded them): the run goes on with this '
                 'command\'s, as if the run had them: %s', path, ', '.join('--' + n.replace('_', '-') for n in unrecorded),
                 ', '.join(f'--{n.replace("_", "-")} {now[n]}' for n in unrecorded))
    names = [name for name in start.resumed if name in saved and saved[name] != now[name]]
    if saved.get('global_batch') == now['global_batch'] and saved.get('lr') != now['lr']:
        names.append('lr')
    differences = [f'--{name.replace("_", "-")} {saved.get(name)} in the saved run, {now[name]} now' for name in names]
    # The validation resize is the backend's kind (DALI's antialiased, ImageRecordIter's plain linear): another
    # kind would validate the rest of the run, and choose its best epoch, on differently resized images.
    if saved.get('val_interpolation', now['val_interpolation']) != now['val_interpolation']:
        differences.append(f'validation resized with {saved["val_interpolation"]} interpolation in the saved run, '
                           f'{now["val_interpolation"]} now (--data-backend {start.backend}; '
                           f'{BACKENDS_OF[saved["val_interpolation"]]} resize as the run did)')
    if differences:
        raise RecipeError(f'{path} belongs to a run with other settings ({"; ".join(differences)}). A workspace '
                          f'holds one run: give this one a new --workspace, or move {os.path.basename(path)} away to '
                          f'start over here. To continue that run with these settings (more epochs, say), start a new '
                          f'workspace from its state: --load {path} --workspace NEW_FOLDER')


def training_start(workspace, start, net, set_aside=True):
    """Where training starts: the State to resume, or None for a new run, with the weights already in `net`.
    One rule: the workspace's last state is resumed when it exists, whatever weights --load names (with or
    without --finetune: an interrupted run rerun with its own command continues); only --load of a .state
    file (without --finetune) resumes that state instead. Else --load gives the weights of a new run (with
    --finetune every layer but a classifier of another width); else the fresh initialisation stays.
    `set_aside`: whether this process may set a damaged last state aside (one worker of a run does it).
    `workspace`: the run's Workspace; `start`: a TrainingStart."""
    last = workspace.last_state
    explicit_state = bool(start.load and start.load.endswith('.state') and not start.finetune)
    # A --benchmark-iters run measures afresh every time: a finished state in its workspace would leave it
    # nothing to train (benchmark.py's points, or a sweep of runs in one folder, reported stale numbers).
    resume = os.path.exists(last) and not explicit_state and not start.measuring
    if resume or explicit_state:
        path = last if resume else start.load
        log.info('Resuming from %s%s', path, f' (the workspace\'s state wins over --load {start.load}: give another '
                 '--workspace to start again from it)' if resume and start.load else '')
        if set_aside and not resume and os.path.exists(last) and os.path.abspath(last) != os.path.abspath(path):
            set_aside_if_damaged(last)
        state = checkpoint.read_state(path, fallback=workspace.previous_state)
        if resume:
            check_same_run(start, state.meta, path)
        checkpoint.load_params_into(net, weight_conversion.convert(state.params, net, source=path)[0],
                                    checkpoint.network_contexts(net))
        log.info('Loaded %s: epoch %d, iteration %d', path, state.meta['epoch'], state.meta['iteration'])
        return state
    if start.load is None:
        return None
    if not os.path.exists(start.load):
        raise RecipeError(f'--load {start.load}: no such file')
    weight_loading.load_weights(net, start.load, start.mean, start.std, finetune=start.finetune)
    return None


def check_weights_source(mode, workspace, load=None, finetune=False, teacher=None, speed_only=False):
    """val, pred and export without --load take their weights from the `workspace` folder (--workspace): a
    mistyped one is an error, not a new empty folder (`speed_only`: a --mode val --no-metrics speed measurement,
    which may run on random weights, see evaluation.py). `load`, `finetune`, `teacher`: --load, --finetune,
    --teacher, checked too."""
    if mode in ('val', 'pred', 'export') and not (load or speed_only) and not os.path.isdir(workspace):
        raise RecipeError(f'--workspace {workspace} does not exist, and --mode {mode} takes its weights '
                          'from the workspace: give the folder of a training run, or --load a checkpoint')
    # Before anything is written: a failed start leaves no log files behind.
    if load and not os.path.isfile(load):
        raise RecipeError(f'--load {load}: no such file')
    if teacher is not None and mode not in ('train', 'train_val'):
        raise RecipeError(f'--teacher distils while training: --mode {mode} does not train')
    if teacher is not None and not os.path.isfile(teacher):
        raise RecipeError(f'--teacher {teacher}: no such file')
    if finetune and not load:
        raise RecipeError('--finetune fine-tunes the weights of --load, and none was given: add --load WEIGHTS (see '
                          'the README\'s "Bring your own weights" for where ImageNet weights come from), or leave '
                          '--finetune out to train from scratch')
