"""MLPerf Training's result log (`--mlperf-log PATH`): the `:::MLLOG {json}` lines MLCommons' compliance checker
reads, written by rank 0 of a training run, independent of the recipe's other logs. `--recipe mlperf` writes
`mlperf.log` in the workspace (recipes.py). Produce one, then check it with MLCommons' checker (mlcommons/logging):

    ./runner -n 8 --recipe mlperf --submission-org ACME --submission-platform 1xDGXH100 --workspace runs/rn50
    python -m mlperf_logging.compliance_checker --usage training --ruleset 4.0.0 runs/rn50/mlperf.log

The format (mlperf_logging.mllog): one line per event, `:::MLLOG ` and a JSON object with `namespace` (""),
`time_ms` (wall clock in milliseconds), `event_type` (POINT_IN_TIME, INTERVAL_START or INTERVAL_END), `key`,
`value` and `metadata` (`file` and `lineno` of the recipe's call, plus what the key needs). A run, in order:

    init_start (at train.py's start), cache_clear, submission_org, _platform, _division, _status,
    _benchmark (resnet), global_batch_size, gradient_accumulation_steps, seed, opt_name and the optimizer's
    hyper-parameters (lars_opt_* and lars_epsilon, or sgd_opt_*, model_bn_span, opt_learning_rate_warmup_epochs),
    init_stop, run_start (before the loaders touch the data), train_samples, eval_samples, the decay steps;
    per epoch epoch_start and epoch_stop, at the --eval-period epochs eval_start, eval_accuracy, eval_stop;
    run_stop with status success (an evaluation reached --target-accuracy) or aborted.

MLPerf numbers epochs from 1 (its Training rules, "Epoch numbering"): epoch_num is the recipe's epoch + 1. Time to
train is run_stop - run_start; report.json's summary gives it (`mlperf.time_to_train`, read back by summary()).
The rules (training ruleset 4.0.0: common.yaml, closed_common.yaml, closed_resnet.yaml; the Training rules'
hyper-parameter table and evaluation frequency) are checked before anything starts (check_flags): a run the log
could not record as asked is one error. A run that resumes a state writes no log (MLPerf times one run from
initialisation; the first part's log, ending in run_stop aborted, stays), and one with a log evaluates at its
--eval-period epochs only (fit.evaluated), every image of the validation set once (inference.validate).
"""
import argparse
import json
import logging
import math
import os
import sys
import time

from rn50.checkpoints.workspace import Workspace
from rn50.errors import RecipeError

log = logging.getLogger(__name__)

TOKEN = ':::MLLOG '
POINT, START, END = 'POINT_IN_TIME', 'INTERVAL_START', 'INTERVAL_END'
BENCHMARK = 'resnet'
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


def enabled(args):
    """Whether the run writes a result log (--mlperf-log given or set by --recipe mlperf, and not `none`)."""
    return args.mlperf_log not in (None, OFF)


def log_path(args):
    """--mlperf-log as given when absolute, else in the workspace."""
    return Workspace.of(args).place(args.mlperf_log)


# ----------------------------------------------------------------------------------------------------------
# The rules, before anything starts


def check_flags(args, given):
    """RecipeError, before anything starts (train.py and the runner, through fit.check_schedule_flags), for a
    result log that cannot be what was asked: one of this group's flags given where no log is written, a run
    MLPerf would not time (no validation, a --benchmark-iters measurement, no target, a teacher's knowledge),
    an optimizer or schedule without MLPerf keys, and in the closed division hyper-parameters outside the
    rules."""
    given = [name for name in FLAGS if name in given]
    training = args.mode in ('train', 'train_val') and not args.test_io
    if not enabled(args):
        extra, why = [name for name in given if name != 'mlperf_log'], 'this run writes none (--mlperf-log PATH)'
    else:
        extra, why = ([] if training else given), f'training writes one, not --mode {args.mode}' + \
            (' --test-io' if args.test_io else '')
    if extra:
        raise RecipeError(f'--{extra[0].replace("_", "-")} fills an MLPerf result log, and {why}')
    if not (training and enabled(args)):
        return
    problems, closed = run_problems(args), closed_problems(args) if args.submission_division == 'closed' else []
    if problems or closed:
        ways = ['--submission-division open takes other hyper-parameters'] * bool(closed) + [
            f'--mlperf-log {OFF} writes no log']
        raise RecipeError(f'an MLPerf result log (--mlperf-log {args.mlperf_log}) cannot record this run: '
                          f'{"; ".join(problems + closed)} ({"; ".join(ways)})')


def run_problems(args):
    """What makes a run one MLPerf would not time, whatever the division."""
    problems = []
    if args.mode != 'train_val':
        problems.append(f'--mode {args.mode} does not validate (MLPerf scores evaluations: --mode train_val)')
    if args.benchmark_iters:
        problems.append('--benchmark-iters trains and validates part of the data')
    if args.data_backend == 'synthetic':
        problems.append('--data-backend synthetic has no data to reach a target on')
    if args.no_metrics:
        problems.append('--no-metrics computes no accuracy')
    if args.target_accuracy is None:
        problems.append(f'no --target-accuracy (the run stops at its quality target, {QUALITY_TARGET} for ResNet-50)')
    if args.begin_epoch:
        problems.append(f'--begin-epoch {args.begin_epoch} starts the schedule part-way (MLPerf times it from 0)')
    if args.teacher is not None:
        problems.append('--teacher distils pretrained knowledge (the rules allow no pre-training)')
    if args.optimizer not in ('lars', 'sgd'):
        problems.append(f'--optimizer {args.optimizer} (MLPerf\'s ResNet-50 keys are lars\'s or sgd\'s)')
    if args.lr_schedule != 'poly':
        problems.append(f'--lr-schedule {args.lr_schedule} (MLPerf\'s ResNet-50 decays polynomially: poly)')
    return problems


def closed_problems(args):
    """The hyper-parameters outside the closed division's rules: the quality target and evaluation frequency
    (Training rules), the values the HP table fixes to the reference or constrains (lars_* / sgd_*)."""
    batch = args.batch_size * args.grad_accum_steps
    problems = []
    if args.target_accuracy is not None and args.target_accuracy < QUALITY_TARGET:
        problems.append(f'--target-accuracy {args.target_accuracy:g} (the closed target is {QUALITY_TARGET}: '
                        'closed_resnet.yaml wants an eval_accuracy at least that)')
    if args.eval_period != EVAL_PERIOD:
        problems.append(f'--eval-period {args.eval_period} (ResNet-50 evaluates every {EVAL_PERIOD} epochs)')
    if not math.isclose(args.end_lr, END_LR):
        problems.append(f'--end-lr {args.end_lr:g} (the end learning rate is the reference\'s {END_LR:g})')
    if args.lr_poly_power != POLY_POWER:
        problems.append(f'--lr-poly-power {args.lr_poly_power:g} (the reference\'s power is {POLY_POWER:g})')
    if not args.warmup_prefix:
        problems.append('--warmup-prefix 0 (the reference decays after the warm-up)')
    power = math.log2(args.wd / 0.0001) if args.wd > 0 else 0.5
    if not math.isclose(power, round(power), abs_tol=1e-9):
        problems.append(f'--wd {args.wd:g} (the weight decay is 0.0001 x 2^N)')
    if args.mom != MOMENTUM and (args.optimizer == 'sgd' or batch < LARGE_BATCH):
        problems.append(f'--mom {args.mom:g} (momentum is {MOMENTUM:g}, for lars below a global batch of '
                        f'{LARGE_BATCH})')
    if args.label_smoothing not in (0, 0.1):
        problems.append(f'--label-smoothing {args.label_smoothing:g} (0 or 0.1)')
    if args.tta is not None:
        problems.append(f'--tta {args.tta} (the quality measure is the reference\'s, one centre crop)')
    if args.optimizer == 'lars':
        if args.lars_eps != LARS_EPSILON:
            problems.append(f'--lars-eps {args.lars_eps:g} (LARS epsilon is the reference\'s {LARS_EPSILON:g})')
        if args.warmup_epochs is not None and args.warmup_epochs <= 0:
            problems.append('--warmup-epochs 0 (lars_opt_learning_rate_warmup_epochs is more than 0)')
    if args.optimizer == 'sgd':
        if args.warmup_epochs is not None and args.warmup_epochs != int(args.warmup_epochs):
            problems.append(f'--warmup-epochs {args.warmup_epochs:g} (sgd warms up a whole number of epochs)')
        if not math.isclose(args.lr / 0.001, round(args.lr / 0.001), abs_tol=1e-6):
            problems.append(f'--lr {args.lr:g} (sgd_opt_base_learning_rate is a multiple of 0.001)')
    return problems


# ----------------------------------------------------------------------------------------------------------
# The writer


class ResultLog:
    """The result log of one run: writes on rank 0 (`path`), is silent elsewhere (None). fit.py calls the
    hooks: start() before the loaders, data(), epoch_start/epoch_stop, eval_start/eval_stop, run_stop."""

    def __init__(self, path=None, args=None):
        self.args = args
        self.path, self.file = path, None
        self.run_start_ms = self.open_epoch = None
        if path is not None:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                self.file = open(path, 'w', buffering=1)
            except OSError as e:
                raise RecipeError(f'--mlperf-log {path}: cannot write it ({e.strerror or e})') from e

    def event(self, key, value=None, metadata=None, event_type=POINT, when=None):
        """One line: `when` (time.time() seconds) or now, the caller's file and line."""
        if self.file is None:
            return None
        frame = sys._getframe(1)
        while os.path.abspath(frame.f_code.co_filename) == HERE:
            frame = frame.f_back
        ms = int(round((time.time() if when is None else when) * 1000))
        where = {'file': os.path.relpath(frame.f_code.co_filename, ROOT), 'lineno': frame.f_lineno}
        record = {'namespace': '', 'time_ms': ms, 'event_type': event_type, 'key': key, 'value': value,
                  'metadata': dict(where, **(metadata or {}))}
        self.file.write(TOKEN + json.dumps(record) + '\n')
        return ms

    def data(self, train_loader, val_loader):
        """After run_start: the samples of an epoch and of an evaluation, and the decay's optimizer steps."""
        if self.file is None:
            return
        args = self.args
        self.event('train_samples', train_loader.num_examples)
        self.event('eval_samples', val_loader.num_examples)
        steps = -(-train_loader.num_batches // args.grad_accum_steps)       # optimizer steps an epoch
        decay = args.num_epochs - (args.warmup_epochs if args.warmup_prefix else 0)
        self.event(f'{args.optimizer}_opt_learning_rate_decay_steps', int(round(decay * steps)))

    def epoch_start(self, epoch):
        self.open_epoch = epoch
        self.event('epoch_start', metadata={'epoch_num': epoch + 1}, event_type=START)

    def epoch_stop(self, epoch):
        self.open_epoch = None
        self.event('epoch_stop', metadata={'epoch_num': epoch + 1}, event_type=END)

    def eval_start(self, epoch):
        self.event('eval_start', metadata={'epoch_num': epoch + 1}, event_type=START)

    def eval_stop(self, epoch, metrics):
        """eval_accuracy and eval_stop; run_stop success at once when it reaches --target-accuracy (the rules
        let the clock stop as soon as the target is known: the checkpoints written after it are not timed)."""
        if self.file is None:
            return
        self.event('eval_accuracy', metrics['val.accuracy'], {'epoch_num': epoch + 1})
        self.event('eval_stop', metadata={'epoch_num': epoch + 1}, event_type=END)
        if metrics['val.accuracy'] >= self.args.target_accuracy:
            self.stop('success')

    def run_stop(self):
        """run_stop aborted, where the target was not reached (a stop, the end of the epochs, --run-epochs); an
        epoch a signal interrupted ends here."""
        if self.file is None:
            return
        if self.open_epoch is not None:
            self.epoch_stop(self.open_epoch)
        self.stop('aborted')

    def stop(self, status):
        stop_ms = self.event('run_stop', metadata={'status': status}, event_type=END)
        self.file.close()
        self.file = None
        log.info('MLPerf result log %s: run_stop %s, time to train %.1f s (run_start to run_stop)', self.path,
                 status, (stop_ms - self.run_start_ms) / 1000)


def start(args, world, seed, resumed):
    """The run's ResultLog, opened before the loaders touch the data: init_start (at the process's start,
    world.start_time), cache_clear, the submission and hyper-parameter keys, init_stop, run_start. A silent one
    without --mlperf-log, on ranks but 0, and for a resumed run (said in the log). A collective (the page cache
    of every node): every worker calls it."""
    if not enabled(args):
        return ResultLog()
    if resumed:
        if world.rank == 0:
            log.warning('This run resumes a state: MLPerf times one uninterrupted run from initialisation, so it '
                        'writes no MLPerf result log (%s, if there, is the first part\'s: it ends with run_stop '
                        'aborted). A new --workspace starts a run that writes one', log_path(args))
        return ResultLog()
    if args.load:
        raise RecipeError(f'--load {args.load} starts from weights, and MLPerf\'s rules allow no pre-training: an '
                          f'MLPerf run starts from the initialisation (leave --load out, or --mlperf-log {OFF})')
    cleared = clear_cache(args, world)
    result = ResultLog(log_path(args) if world.rank == 0 else None, args)
    result.event('init_start', event_type=START, when=world.start_time)
    result.event('cache_clear', cleared)
    for key, value in header(args, world, seed):
        result.event(key, value)
    if world.rank == 0 and args.submission_division == 'closed':
        note_closed_model(args)
    result.event('init_stop', event_type=END)
    result.run_start_ms = result.event('run_start', event_type=START)
    return result


def header(args, world, seed):
    """(key, value) of the submission and of the hyper-parameters, under MLPerf's names."""
    batch = args.batch_size * args.grad_accum_steps
    keys = [('submission_org', args.submission_org),
            ('submission_platform', args.submission_platform or f'{world.size}x{world.devices.kind.upper()}'),
            ('submission_division', args.submission_division), ('submission_status', args.submission_status),
            ('submission_benchmark', BENCHMARK), ('global_batch_size', batch),
            ('gradient_accumulation_steps', args.grad_accum_steps), ('seed', seed),
            ('opt_name', args.optimizer)]
    name = args.optimizer
    keys += [(f'{name}_opt_base_learning_rate', args.lr), (f'{name}_opt_end_learning_rate', args.end_lr),
             (f'{name}_opt_learning_rate_decay_poly_power', args.lr_poly_power),
             (f'{name}_opt_momentum', args.mom), (f'{name}_opt_weight_decay', args.wd)]
    if name == 'lars':
        keys += [('lars_epsilon', args.lars_eps), ('lars_opt_learning_rate_warmup_epochs', args.warmup_epochs)]
    else:       # the batch each batchnorm normalises over: a device's
        keys += [('model_bn_span', args.batch_size // (world.size * len(world.devices.contexts))),
                 ('opt_learning_rate_warmup_epochs', args.warmup_epochs)]
    return keys


def note_closed_model(args):
    """A closed result also needs the reference's model, data and image size, which the log does not show: a
    warning when this run has others."""
    shape = f'{args.image_shape[1]}x{args.image_shape[2]}'
    if (args.arch, args.num_layers, shape) != ('resnetv15', 50, '224x224') or args.num_classes not in (1000, 1001):
        log.warning('--submission-division closed: MLPerf\'s reference trains ResNet-50 v1.5 at 224x224 on ImageNet\'s '
                    '1000 classes, this run %s-%d at %s on %d classes; its log follows the rules the checker reads, '
                    'but it is no closed result', args.arch, args.num_layers, shape, args.num_classes)


def drop_page_cache():
    """Write dirty pages back and drop the OS page cache (root only); None, or why it could not."""
    os.sync()
    try:
        with open(DROP_CACHES, 'w') as f:
            f.write('3\n')
    except OSError as e:
        return e.strerror or str(e)
    return None


def clear_cache(args, world):
    """cache_clear's value: --mlperf-cache-clear drop drops the page cache on every node (its local rank 0) and
    is true when all could; done is true, no false."""
    if args.mlperf_cache_clear != 'drop':
        return args.mlperf_cache_clear == 'done'
    reason = drop_page_cache() if world.local_rank == 0 else None
    failed = world.allreduce_sum([reason is not None])[0]
    if failed and world.rank == 0:
        log.warning('The OS page cache could not be dropped on %d node(s) (%s): cache_clear false in the MLPerf '
                    'log. MLPerf\'s rules ask for a flushed cache before each run: as root, `sync; echo 3 > %s`, '
                    'then --mlperf-cache-clear done', failed, reason or 'on another node', DROP_CACHES)
    return not failed


def summary(args):
    """report.json's entries of the result log, read back from it: its path, run_stop's status and the time to
    train (run_stop - run_start, seconds); {} without one (a resumed run reports its first part's)."""
    if not enabled(args) or not os.path.exists(log_path(args)):
        return {}
    with open(log_path(args)) as f:
        records = {r['key']: r for r in (json.loads(line[len(TOKEN):]) for line in f if line.startswith(TOKEN))}
    result = {'mlperf.log': log_path(args)}
    if 'run_start' in records and 'run_stop' in records:
        result['mlperf.status'] = records['run_stop']['metadata']['status']
        result['mlperf.time_to_train'] = (records['run_stop']['time_ms'] - records['run_start']['time_ms']) / 1000
    return result
