"""MLPerf Training's result log (`--mlperf-log PATH`): the `:::MLLOG {json}` lines MLCommons' compliance checker
reads, written by rank 0 of a training run through MLCommons' own library (`mlperf_logging.mllog`, its constants
for the keys), independent of the recipe's other logs. `--recipe mlperf` writes `mlperf.log` in the workspace
(recipes.py). Produce one, then check it with MLCommons' checker (the same package):

    ./runner -n 8 --recipe mlperf --submission-org ACME --submission-platform 1xDGXH100 --workspace runs/rn50
    python -m mlperf_logging.compliance_checker --usage training --ruleset 4.0.0 runs/rn50/mlperf.log

Each run writes through an mllog MLLogger of its own, over a logging.Logger with one file handler: not mllog's
shared logger (mllog.config adds a file handler to it at every call), so a process that runs the recipe several
times writes each run's lines to that run's file alone. A run, in order:

    init_start (at train.py's start), cache_clear, submission_org, _platform, _division, _status,
    _benchmark (resnet), global_batch_size, gradient_accumulation_steps, seed, opt_name and the optimizer's
    hyper-parameters (lars_opt_* and lars_epsilon, or sgd_opt_*, model_bn_span, opt_learning_rate_warmup_epochs),
    init_stop, run_start (before the loaders touch the data), train_samples, eval_samples, the decay steps;
    per epoch epoch_start and epoch_stop, at the --eval-period epochs eval_start, eval_accuracy, eval_stop;
    run_stop with status success (an evaluation reached --target-accuracy) or aborted.

MLPerf numbers epochs from 1 (its Training rules, "Epoch numbering"): epoch_num is the recipe's epoch + 1. Time to
train is run_stop - run_start; report.json's summary gives it (`mlperf.time_to_train`, read back by summary()).
The rules (training ruleset 4.0.0: common.yaml, closed_common.yaml, closed_resnet.yaml and the 3.1.0
closed_resnet_lars.yaml / _sgd.yaml it reads; the Training rules' hyper-parameter table and evaluation frequency)
are checked before anything starts (check_flags): a run the log could not record as asked is one error. A run that
resumes a state writes no log (MLPerf times one run from initialisation; the first part's log, ending in run_stop
aborted, stays), and one with a log evaluates at its --eval-period epochs only (fit.evaluated), every image of the
validation set once (evaluation.validate).
"""
import argparse
import dataclasses
import json
import logging
import math
import os
import re
import sys
import time

from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import MLLogger

from rn50.errors import RecipeError

log = logging.getLogger(__name__)

TOKEN = ':::MLLOG '              # each line's start (summary() reads the log back)
QUALITY_TARGET = 0.759          # the Training rules' ResNet-50 target; closed_resnet.yaml wants an eval_accuracy >= it
EVAL_PERIOD = 4                 # the rules' evaluation frequency for ResNet-50: every 4 epochs, offset 0 to 3
END_LR, POLY_POWER, LARS_EPSILON, MOMENTUM = 0.0001, 2.0, 0.0, 0.9     # fixed to the reference (the HP table)
LARGE_BATCH = 32768             # LARS momentum is 0.9 below this global batch, free above
OFF = 'none'                    # --mlperf-log none: no log (e.g. under --recipe mlperf)
DROP_CACHES = '/proc/sys/vm/drop_caches'
FLAGS = ('mlperf_log', 'submission_org', 'submission_platform', 'submission_division', 'submission_status',
         'mlperf_cache_clear')
HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))   # the repository: rn50/reports/ up


def text(value):
    """A flag value that is not empty (the checker refuses an empty submission_org or _platform)."""
    if not value.strip():
        raise argparse.ArgumentTypeError('an empty value (the compliance checker refuses it)')
    return value


def add_args(parser):
    group = parser.add_argument_group('MLPerf', 'an MLPerf Training result log of the run (mlperf_log.py)')
    group.add_argument('--mlperf-log', default=None, metavar='PATH',
                       help=f'write MLPerf\'s result log (:::MLLOG lines) to PATH (relative: in the workspace); '
                            f'--recipe mlperf: mlperf.log; {OFF}: no log')
    group.add_argument('--submission-org', type=text, default='unaffiliated',
                       help='the log\'s submission_org: who submits (default unaffiliated)')
    group.add_argument('--submission-platform', type=text, default=None,
                       help='the log\'s submission_platform: the system (default: workers x device, e.g. 8xGPU)')
    group.add_argument('--submission-division', default='closed', choices=['closed', 'open'],
                       help='the log\'s submission_division (closed: the rules\' hyper-parameters, checked at start)')
    group.add_argument('--submission-status', default='onprem', choices=['onprem', 'cloud', 'preview', 'research'],
                       help='the log\'s submission_status: the system\'s availability')
    group.add_argument('--mlperf-cache-clear', default='drop', choices=['drop', 'done', 'no'],
                       help='the log\'s cache_clear: drop, each node drops the OS page cache before the run starts '
                            '(needs root, else cache_clear false and a warning); done, your launcher dropped it; '
                            'no, not dropped (false)')
    return group


def enabled(log):
    """Whether the run writes a result log (`log`: --mlperf-log, given or set by --recipe mlperf, and not `none`)."""
    return log not in (None, OFF)


def log_path(log, workspace):
    """The result log's path: --mlperf-log (`log`) as given when absolute, else in the `workspace` (a Workspace);
    None when the run writes none."""
    return workspace.place(log) if enabled(log) else None


# ----------------------------------------------------------------------------------------------------------
# The rules, before anything starts


def check_flags(run, given):
    """RecipeError, before anything starts (train.py and the runner, through fit.check_schedule_flags), for a
    result log that cannot be what was asked (`run`, a Run of the flags, resolved or not; `given`: the
    destinations of the flags the command named): one of this group's flags given where no log is written, a run
    MLPerf would not time (no validation, a --benchmark-iters measurement, no target, a teacher's knowledge),
    an optimizer or schedule without MLPerf keys, and in the closed division hyper-parameters outside the
    rules."""
    given = [name for name in FLAGS if name in given]
    training = run.mode in ('train', 'train_val') and not run.test_io
    if not enabled(run.log):
        extra, why = [name for name in given if name != 'mlperf_log'], 'this run writes none (--mlperf-log PATH)'
    else:
        extra, why = ([] if training else given), f'training writes one, not --mode {run.mode}' + \
            (' --test-io' if run.test_io else '')
    if extra:
        raise RecipeError(f'--{extra[0].replace("_", "-")} fills an MLPerf result log, and {why}')
    if not (training and enabled(run.log)):
        return
    problems, closed = run_problems(run), closed_problems(run) if run.division == 'closed' else []
    if problems or closed:
        ways = ['--submission-division open takes other hyper-parameters'] * bool(closed) + [
            f'--mlperf-log {OFF} writes no log']
        raise RecipeError(f'an MLPerf result log (--mlperf-log {run.log}) cannot record this run: '
                          f'{"; ".join(problems + closed)} ({"; ".join(ways)})')


def run_problems(run):
    """What makes a run (a Run) one MLPerf would not time, whatever the division."""
    problems = []
    if run.mode != 'train_val':
        problems.append(f'--mode {run.mode} does not validate (MLPerf scores evaluations: --mode train_val)')
    if run.measuring:
        problems.append('--benchmark-iters trains and validates part of the data')
    if run.backend == 'synthetic':
        problems.append('--data-backend synthetic has no data to reach a target on')
    if not run.metrics:
        problems.append('--no-metrics computes no accuracy')
    if run.target is None:
        problems.append(f'no --target-accuracy (the run stops at its quality target, {QUALITY_TARGET} for ResNet-50)')
    if run.begin_epoch:
        problems.append(f'--begin-epoch {run.begin_epoch} starts the schedule part-way (MLPerf times it from 0)')
    if run.teacher is not None:
        problems.append('--teacher distils pretrained knowledge (the rules allow no pre-training)')
    if run.optimizer not in ('lars', 'sgd'):
        problems.append(f'--optimizer {run.optimizer} (MLPerf\'s ResNet-50 keys are lars\'s or sgd\'s)')
    if run.lr_schedule != 'poly':
        problems.append(f'--lr-schedule {run.lr_schedule} (MLPerf\'s ResNet-50 decays polynomially: poly)')
    return problems


def closed_problems(run):
    """The hyper-parameters of `run` (a Run) outside the closed division's rules: the quality target and
    evaluation frequency (Training rules), the values the HP table fixes to the reference or constrains
    (lars_* / sgd_*)."""
    batch = run.batch_size * run.grad_accum_steps
    problems = []
    if run.target is not None and run.target < QUALITY_TARGET:
        problems.append(f'--target-accuracy {run.target:g} (the closed target is {QUALITY_TARGET}: '
                        'closed_resnet.yaml wants an eval_accuracy at least that)')
    if run.eval_period != EVAL_PERIOD:
        problems.append(f'--eval-period {run.eval_period} (ResNet-50 evaluates every {EVAL_PERIOD} epochs)')
    if not math.isclose(run.end_lr, END_LR):
        problems.append(f'--end-lr {run.end_lr:g} (the end learning rate is the reference\'s {END_LR:g})')
    if run.poly_power != POLY_POWER:
        problems.append(f'--lr-poly-power {run.poly_power:g} (the reference\'s power is {POLY_POWER:g})')
    if not run.warmup_prefix:
        problems.append('--warmup-prefix 0 (the reference decays after the warm-up)')
    power = math.log2(run.weight_decay / 0.0001) if run.weight_decay > 0 else 0.5
    if not math.isclose(power, round(power), abs_tol=1e-9):
        problems.append(f'--wd {run.weight_decay:g} (the weight decay is 0.0001 x 2^N)')
    if run.momentum != MOMENTUM and (run.optimizer == 'sgd' or batch < LARGE_BATCH):
        problems.append(f'--mom {run.momentum:g} (momentum is {MOMENTUM:g}, for lars below a global batch of '
                        f'{LARGE_BATCH})')
    if run.label_smoothing not in (0, 0.1):
        problems.append(f'--label-smoothing {run.label_smoothing:g} (0 or 0.1)')
    if run.tta is not None:
        problems.append(f'--tta {run.tta} (the quality measure is the reference\'s, one centre crop)')
    if run.optimizer == 'lars':
        if run.lars_epsilon != LARS_EPSILON:
            problems.append(f'--lars-eps {run.lars_epsilon:g} (LARS epsilon is the reference\'s {LARS_EPSILON:g})')
        if run.warmup_epochs is not None and run.warmup_epochs <= 0:
            problems.append('--warmup-epochs 0 (lars_opt_learning_rate_warmup_epochs is more than 0)')
    if run.optimizer == 'sgd':
        if run.warmup_epochs is not None and run.warmup_epochs != int(run.warmup_epochs):
            problems.append(f'--warmup-epochs {run.warmup_epochs:g} (sgd warms up a whole number of epochs)')
        if not math.isclose(run.lr / 0.001, round(run.lr / 0.001), abs_tol=1e-6):
            problems.append(f'--lr {run.lr:g} (sgd_opt_base_learning_rate is a multiple of 0.001)')
    return problems


# ----------------------------------------------------------------------------------------------------------
# The writer

# The optimizer's keys: mllog's constants for LARS; for SGD the names training 4.0.0 reads (its closed_resnet.yaml
# takes 3.1.0's closed_resnet_sgd.yaml), which mllog's constants lack.
OPTIMIZER_KEYS = {
    constants.LARS: {'base_lr': constants.LARS_OPT_BASE_LEARNING_RATE, 'end_lr': constants.LARS_OPT_END_LR,
                     'poly_power': constants.LARS_OPT_LR_DECAY_POLY_POWER, 'momentum': constants.LARS_OPT_MOMENTUM,
                     'weight_decay': constants.LARS_OPT_WEIGHT_DECAY, 'decay_steps': constants.LARS_OPT_LR_DECAY_STEPS},
    constants.SGD: {'base_lr': 'sgd_opt_base_learning_rate', 'end_lr': 'sgd_opt_end_learning_rate',
                    'poly_power': 'sgd_opt_learning_rate_decay_poly_power', 'momentum': 'sgd_opt_momentum',
                    'weight_decay': 'sgd_opt_weight_decay', 'decay_steps': 'sgd_opt_learning_rate_decay_steps'},
}


@dataclasses.dataclass(frozen=True)
class Run:
    """What a run's result log records and what MLPerf's rules check of the run, as values (`of`: from the flags,
    resolved or not): `log` (--mlperf-log) and `path` (where the log goes; None: the run writes none, or `of` had
    no workspace and the run is only checked), the submission (`platform` None: workers x device), the global
    batch and the optimizer's hyper-parameters, the schedule's length and warm-up (`decay_epochs`, the epochs the
    decay spans), the target, `load` (weights to start from: refused), the model (arch, depth, HxW, classes: a
    closed result needs the reference's), and what the rules refuse (the mode, --test-io, a --benchmark-iters
    measurement, the data backend, no metrics, --begin-epoch, a --teacher, the schedule's kind, the evaluation
    period, label smoothing, test-time augmentation)."""
    log: object
    path: object
    org: str
    platform: object
    division: str
    status: str
    cache_clear: str
    batch_size: int
    grad_accum_steps: int
    optimizer: str
    lr: float
    end_lr: float
    poly_power: float
    momentum: float
    weight_decay: float
    lars_epsilon: float
    warmup_epochs: float
    warmup_prefix: int
    num_epochs: int
    target: float
    load: object
    model: tuple
    mode: str = 'train_val'
    test_io: bool = False
    measuring: bool = False
    backend: str = None
    metrics: bool = True
    begin_epoch: int = None
    teacher: object = None
    lr_schedule: str = 'poly'
    eval_period: int = EVAL_PERIOD
    label_smoothing: float = 0.1
    tta: str = None

    @classmethod
    def of(cls, args, workspace=None):
        """The Run of the flags `args`, its log in `workspace` (a Workspace; None: only checked, not written)."""
        return cls(log=args.mlperf_log, path=log_path(args.mlperf_log, workspace) if workspace is not None else None,
                   org=args.submission_org, platform=args.submission_platform, division=args.submission_division,
                   status=args.submission_status, cache_clear=args.mlperf_cache_clear, batch_size=args.batch_size,
                   grad_accum_steps=args.grad_accum_steps, optimizer=args.optimizer, lr=args.lr, end_lr=args.end_lr,
                   poly_power=args.lr_poly_power, momentum=args.mom, weight_decay=args.wd,
                   lars_epsilon=args.lars_eps, warmup_epochs=args.warmup_epochs, warmup_prefix=args.warmup_prefix,
                   num_epochs=args.num_epochs, target=args.target_accuracy, load=args.load,
                   model=(args.arch, args.num_layers, f'{args.image_shape[1]}x{args.image_shape[2]}',
                          args.num_classes),
                   mode=args.mode, test_io=args.test_io, measuring=bool(args.benchmark_iters),
                   backend=args.data_backend, metrics=not args.no_metrics, begin_epoch=args.begin_epoch,
                   teacher=args.teacher, lr_schedule=args.lr_schedule, eval_period=args.eval_period,
                   label_smoothing=args.label_smoothing, tta=args.tta)

    @property
    def decay_epochs(self):
        """The epochs the decay spans: the schedule's after the warm-up (--warmup-prefix 1), else all of them."""
        return self.num_epochs - (self.warmup_epochs if self.warmup_prefix else 0)


def writer(path):
    """An mllog MLLogger writing `path` alone (created, or emptied): its own logging.Logger, outside logging's
    registry (freed with the run), with one file handler, which writes each line out as it comes."""
    logger = logging.Logger(__name__)
    logger.propagate = False
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        logger.addHandler(logging.FileHandler(path, mode='w'))
    except OSError as e:
        raise RecipeError(f'--mlperf-log {path}: cannot write it ({e.strerror or e})') from e
    # mllog trims root_dir from the caller's file as a regular expression (re.sub('^' + root_dir + '/', ...))
    return MLLogger(logger=logger, default_namespace=constants.DEFAULT_NAMESPACE, root_dir=re.escape(ROOT))


def now_ms():
    """mllog's clock: wall-clock milliseconds, as an integer."""
    return int(time.time() * 1000)


class ResultLog:
    """The result log of one run (`run`, a Run): written through `mllogger` (an MLLogger) on rank 0, silent
    elsewhere (None). fit.py calls the hooks: data() once the loaders exist, epoch_start/epoch_stop,
    eval_start/eval_stop, run_stop."""

    def __init__(self, mllogger=None, run=None):
        self.mllogger, self.run = mllogger, run
        self.run_start_ms = self.open_epoch = None

    def write(self, kind, key, value=None, metadata=None, time_ms=None):
        """One line through mllog (`kind`: its start, end or event). Its metadata names the recipe's call: the
        stack_offset skips this module's frames."""
        if self.mllogger is None:
            return
        frame, here = sys._getframe(), 0
        while os.path.abspath(frame.f_code.co_filename) == HERE:
            frame, here = frame.f_back, here + 1
        getattr(self.mllogger, kind)(key, value, metadata=metadata, time_ms=time_ms, stack_offset=here + 1)

    def data(self, train_loader, val_loader):
        """After run_start: the samples of an epoch and of an evaluation, and the decay's optimizer steps."""
        if self.mllogger is None:
            return
        steps = -(-train_loader.num_batches // self.run.grad_accum_steps)       # optimizer steps an epoch
        self.write('event', constants.TRAIN_SAMPLES, train_loader.num_examples)
        self.write('event', constants.EVAL_SAMPLES, val_loader.num_examples)
        self.write('event', OPTIMIZER_KEYS[self.run.optimizer]['decay_steps'],
                   int(round(self.run.decay_epochs * steps)))

    def epoch_start(self, epoch):
        self.open_epoch = epoch
        self.write('start', constants.EPOCH_START, metadata={constants.EPOCH_NUM: epoch + 1})

    def epoch_stop(self, epoch):
        self.open_epoch = None
        self.write('end', constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: epoch + 1})

    def eval_start(self, epoch):
        self.write('start', constants.EVAL_START, metadata={constants.EPOCH_NUM: epoch + 1})

    def eval_stop(self, epoch, metrics):
        """eval_accuracy and eval_stop; run_stop success at once when it reaches the target (the rules let the
        clock stop as soon as the target is known: the checkpoints written after it are not timed)."""
        if self.mllogger is None:
            return
        accuracy = metrics['val.accuracy']
        self.write('event', constants.EVAL_ACCURACY, accuracy, {constants.EPOCH_NUM: epoch + 1})
        self.write('end', constants.EVAL_STOP, metadata={constants.EPOCH_NUM: epoch + 1})
        if accuracy >= self.run.target:
            self.stop(constants.SUCCESS)

    def run_stop(self):
        """run_stop aborted, where the target was not reached (a stop, the end of the epochs, --run-epochs); an
        epoch a signal interrupted ends here."""
        if self.mllogger is None:
            return
        if self.open_epoch is not None:
            self.epoch_stop(self.open_epoch)
        self.stop(constants.ABORTED)

    def stop(self, status):
        stop_ms = now_ms()
        self.write('end', constants.RUN_STOP, metadata={constants.STATUS: status}, time_ms=stop_ms)
        for handler in self.mllogger.logger.handlers:
            handler.close()
        self.mllogger = None
        log.info('MLPerf result log %s: run_stop %s, time to train %.1f s (run_start to run_stop)', self.run.path,
                 status, (stop_ms - self.run_start_ms) / 1000)


def start(run, world, seed, resumed):
    """The ResultLog of `run` (a Run), opened before the loaders touch the data: init_start (at the process's
    start, world.start_time), cache_clear, the submission and hyper-parameter keys, init_stop, run_start. A silent
    one without a log, on ranks but 0, and for a resumed run (said in the log). A collective (the page cache of
    every node): every worker calls it."""
    if run.path is None:
        return ResultLog()
    if resumed:
        if world.rank == 0:
            log.warning('This run resumes a state: MLPerf times one uninterrupted run from initialisation, so it '
                        'writes no MLPerf result log (%s, if there, is the first part\'s: it ends with run_stop '
                        'aborted). A new --workspace starts a run that writes one', run.path)
        return ResultLog()
    if run.load:
        raise RecipeError(f'--load {run.load} starts from weights, and MLPerf\'s rules allow no pre-training: an '
                          f'MLPerf run starts from the initialisation (leave --load out, or --mlperf-log {OFF})')
    cleared = clear_cache(run.cache_clear, world)
    result = ResultLog(writer(run.path) if world.rank == 0 else None, run)
    result.write('start', constants.INIT_START, time_ms=int(world.start_time * 1000))
    result.write('event', constants.CACHE_CLEAR, cleared)
    for key, value in header(run, world, seed):
        result.write('event', key, value)
    if world.rank == 0 and run.division == constants.CLOSED:
        note_closed_model(run.model)
    result.write('end', constants.INIT_STOP)
    result.run_start_ms = now_ms()
    result.write('start', constants.RUN_START, time_ms=result.run_start_ms)
    return result


def header(run, world, seed):
    """(key, value) of the submission and of the hyper-parameters, under MLPerf's names."""
    keys = OPTIMIZER_KEYS[run.optimizer]
    pairs = [(constants.SUBMISSION_ORG, run.org),
             (constants.SUBMISSION_PLATFORM, run.platform or f'{world.size}x{world.devices.kind.upper()}'),
             (constants.SUBMISSION_DIVISION, run.division), (constants.SUBMISSION_STATUS, run.status),
             (constants.SUBMISSION_BENCHMARK, constants.RESNET),
             (constants.GLOBAL_BATCH_SIZE, run.batch_size * run.grad_accum_steps),
             (constants.GRADIENT_ACCUMULATION_STEPS, run.grad_accum_steps), (constants.SEED, seed),
             (constants.OPT_NAME, run.optimizer), (keys['base_lr'], run.lr), (keys['end_lr'], run.end_lr),
             (keys['poly_power'], run.poly_power), (keys['momentum'], run.momentum),
             (keys['weight_decay'], run.weight_decay)]
    if run.optimizer == constants.LARS:
        return pairs + [(constants.LARS_EPSILON, run.lars_epsilon),
                        (constants.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS, run.warmup_epochs)]
    # the batch each batchnorm normalises over: a device's
    return pairs + [(constants.MODEL_BN_SPAN, run.batch_size // (world.size * len(world.devices.contexts))),
                    (constants.OPT_LR_WARMUP_EPOCHS, run.warmup_epochs)]


def note_closed_model(model):
    """A closed result also needs the reference's model, data and image size, which the log does not show: a
    warning when this run (`model`: arch, depth, HxW, classes) has others."""
    arch, layers, shape, classes = model
    if (arch, layers, shape) != ('resnetv15', 50, '224x224') or classes not in (1000, 1001):
        log.warning('--submission-division closed: MLPerf\'s reference trains ResNet-50 v1.5 at 224x224 on ImageNet\'s '
                    '1000 classes, this run %s-%d at %s on %d classes; its log follows the rules the checker reads, '
                    'but it is no closed result', arch, layers, shape, classes)


def drop_page_cache():
    """Write dirty pages back and drop the OS page cache (root only); None, or why it could not."""
    os.sync()
    try:
        with open(DROP_CACHES, 'w') as f:
            f.write('3\n')
    except OSError as e:
        return e.strerror or str(e)
    return None


def clear_cache(mode, world):
    """cache_clear's value for --mlperf-cache-clear `mode`: drop drops the page cache on every node (its local rank
    0) and is true when all could; done is true, no false."""
    if mode != 'drop':
        return mode == 'done'
    reason = drop_page_cache() if world.local_rank == 0 else None
    failed = world.comm.allreduce_sum([reason is not None])[0]
    if failed and world.rank == 0:
        log.warning('The OS page cache could not be dropped on %d node(s) (%s): cache_clear false in the MLPerf '
                    'log. MLPerf\'s rules ask for a flushed cache before each run: as root, `sync; echo 3 > %s`, '
                    'then --mlperf-cache-clear done', failed, reason or 'on another node', DROP_CACHES)
    return not failed


def summary(path):
    """report.json's entries of the result log at `path` (Run.path; None: the run writes none), read back from it:
    its path, run_stop's status and the time to train (run_stop - run_start, seconds); {} without one (a resumed
    run reports its first part's)."""
    if path is None or not os.path.exists(path):
        return {}
    with open(path) as f:
        records = {r['key']: r for r in (json.loads(line[len(TOKEN):]) for line in f if line.startswith(TOKEN))}
    result = {'mlperf.log': path}
    if constants.RUN_START in records and constants.RUN_STOP in records:
        stop, run_start = records[constants.RUN_STOP], records[constants.RUN_START]
        result['mlperf.status'] = stop['metadata'][constants.STATUS]
        result['mlperf.time_to_train'] = (stop['time_ms'] - run_start['time_ms']) / 1000
    return result
