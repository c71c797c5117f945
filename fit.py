"""Training: the Training flags, the epoch loop, validation, checkpoint cadence, divergence checks, stopping. A
composer, like train.py: it turns the resolved flags into the library's records once (StepSettings, Schedule,
CheckpointPolicy, AverageSettings, Validation, Run) and hands them to rn50/.

train.py builds everything this needs and calls, for --mode train and train_val:

    progress = fit.train(args, fit.TrainingRun(net, world, seed, dataset, loaders, network, build_network,
                                               dllogger, stop, workspace))
    # progress.history; loaders: train.Loaders, dataset: contract.Dataset, network: the nets.network.Network of
    # net, build_network: models.build on the worker's kind of device (a --teacher), workspace: its Workspace

What happens, in order:
1. The state to start from (the Saver's start, rn50/checkpoints/saver.py and resume.py): --load FILE (a
   .params file or a .state file), else the workspace's `<prefix>_last.state` (automatic resume), else the
   fresh initialisation; every worker must find rank 0's, or all stop with one error.
2. Per epoch: iterations with the learning rate of the run's schedule.Schedule, a pure function of (epoch,
   iteration); validation (train_val, evaluation.validate); then checkpoints (the Saver): `<prefix>_NNNN.params`
   every --save-frequency epochs (the newest --keep-checkpoints kept), `<prefix>_best.params` on a new best
   top-1 (`<prefix>_ema_best.params` of --model-ema's average, ema.py), and always `<prefix>_last.state`,
   which holds everything an exact resume needs (parameters, optimizer state, loss scale, epoch and
   iteration, best accuracy, metric history and the seed that fixes the data order and mixup draws).
3. SIGTERM or SIGUSR1 (rn50/launch/stop.py's StopRequest) stops the run at the next iteration boundary (the
   next --disp-batches boundary with several workers, which must agree), writes the last state and returns;
   the next run resumes from there.
"""
import dataclasses
import logging
import os
import time

import numpy as np

from rn50.checkpoints import checkpoint
from rn50.checkpoints import optimizer_state
from rn50.checkpoints.saver import CheckpointPolicy, Progress, Saver
from rn50 import flags
from rn50.data import classes
from rn50.data import contract
from rn50.data.contract import batches, device_slices
from rn50.data.preset import TrainingPreset
from rn50.errors import RecipeError
from rn50.inference import evaluation, prediction
from rn50.nets.network import Network
from rn50.optim import factory
from rn50.optim import lars
from rn50.optim import schedule
from rn50.reports import logs
from rn50.reports import mlperf_log
from rn50.reports import tensorboard_log
from rn50.review import examples
from rn50.training import distill
from rn50.training import losses
from rn50.training import ema
from rn50.training import history
from rn50.training import step as training_step
from rn50.training.epoch_loss import EpochLoss
from rn50.training.step import StepSettings, TrainingStep

log = logging.getLogger(__name__)

# When train_val validates (evaluated): a resume must keep it, the best epoch being chosen among those validated.
EVALUATION = ('eval_period', 'eval_offset')
# What changes a run's result, as each concern's record names it: a resumed run must have these flags as its state
# recorded them (resume.check_same_run), so a new flag of one concern is added to that concern's RESUMED alone.
# The global batch and the worker count may change (Saver.resume), --wd and --mom too (the command's win).
RESUMED_SETTINGS = (contract.Dataset.RESUMED + Network.RESUMED + schedule.Schedule.RESUMED + StepSettings.RESUMED +
                    TrainingPreset.RESUMED + EVALUATION)


def add_fit_args(parser):
    group = parser.add_argument_group('Training', 'the optimisation: schedule, optimizer, targets, checkpoints')
    group.add_argument('--num-epochs', type=flags.integer(minimum=1), default=None,
                       help='number of epochs, the length of the schedule (default 90); in val mode the '
                            'number of validation passes (default 1)')
    group.add_argument('--eval-period', type=flags.integer(minimum=1), default=1,
                       help='train_val: validate every N epochs (and after the last), from --eval-offset')
    group.add_argument('--eval-offset', type=flags.integer(minimum=0), default=0,
                       help='train_val: the first epoch validated with --eval-period (epoch %% N == K)')
    group.add_argument('--run-epochs', type=flags.integer(minimum=1, sentinel=-1), default=-1,
                       help='run at most this many epochs in this invocation (-1: no limit); the schedule '
                            'still spans --num-epochs')
    schedule.add_args(group)
    factory.add_args(group)
    losses.add_args(group)
    group.add_argument('--disp-batches', type=flags.integer(minimum=1), default=20,
                       help='log progress every n batches')
    group.add_argument('--model-prefix', default='model', help='checkpoint file name prefix')
    group.add_argument('--save-frequency', type=flags.integer(minimum=-1), default=-1,
                       help='write <prefix>_NNNN.params every N epochs; -1: only <prefix>_best.params; '
                            '0: no .params files. <prefix>_last.state is always written')
    group.add_argument('--keep-checkpoints', type=flags.integer(minimum=0), default=0,
                       help='keep only the newest N <prefix>_NNNN.params (0: all)')
    group.add_argument('--begin-epoch', type=flags.integer(minimum=0), default=None,
                       help='start from this epoch (with --load of a .params file, or to shift the schedule)')
    group.add_argument('--finetune', action='store_true',
                       help='start a new task from --load weights (any format checkpoint.py reads): a '
                            'classifier of another width than --num-classes is re-initialised, every other '
                            'layer loaded; epoch 0, fresh optimizer. Without it a class-count mismatch is an '
                            'error')
    group.add_argument('--backbone-lr-mult', type=flags.real(minimum=0, maximum=1), default=1.0,
                       help='learning rate of every layer but the classifier, as a multiple of the schedule\'s '
                            '(e.g. 0.1 when fine-tuning: the pretrained layers move less than the new head)')
    training_step.add_args(group)
    lars.add_args(group)
    distill.add_args(group)
    ema.add_args(group)
    group.add_argument('--target-accuracy', type=flags.real(minimum=0, maximum=1, exclusive=True), default=None,
                       help='stop after the first validation whose top-1 reaches this (e.g. 0.759)')
    tensorboard_log.add_args(group)
    return group


def check_training_flags(args):
    """RecipeError for training flags that cannot work together, before any training."""
    if args.target_accuracy is not None and args.mode != 'train_val':
        raise RecipeError('--target-accuracy needs a validation every epoch: use --mode train_val')
    losses.check(args.bce_loss, args.bce_target_thresh)
    training_step.check_overflow_check(args)
    if (args.eval_period, args.eval_offset) != (1, 0) and args.mode != 'train_val':
        raise RecipeError('--eval-period and --eval-offset say when train_val validates: use --mode train_val')


def evaluated(args, epoch):
    """Whether train_val validates after `epoch`: every --eval-period epochs from --eval-offset (MLPerf's
    sparse evaluation: --eval-period 4 --eval-offset 2 validates after epochs 2, 6, 10, ...), and after the
    schedule's last epoch (not with an MLPerf result log: MLPerf evaluates on its period alone). The best
    checkpoint and --target-accuracy see only these epochs."""
    return epoch % args.eval_period == args.eval_offset % args.eval_period or \
        (epoch == args.num_epochs - 1 and not mlperf_log.enabled(args.mlperf_log))


def check_schedule_flags(args, origin):
    """RecipeError for a schedule that cannot be what was meant (train.py and the runner call it before anything
    starts, the flags resolved or not): schedule.check's, and the MLPerf result log's rules. `origin`:
    resolve.FlagSources, which flags the command gave and which the recipe set."""
    # MLPerf's log's rules (val modes too: its flags alone are an error)
    mlperf_log.check_flags(mlperf_log.Run.of(args), origin.given)
    if args.mode not in ('train', 'train_val') or args.test_io:
        return
    schedule.check(args.lr_steps, args.warmup_epochs, args.num_epochs, 'warmup_epochs' in origin.from_recipe)


# ----------------------------------------------------------------------------------------------------------
# The epoch


class LookAhead:
    """The batches of `source`, the next one fetched early by `fetch_next` (the step's before_sync). A batch
    stays valid then: the step has queued its reads, and MXNet's engine orders them before any reuse of its
    memory (ImageRecordIter waits to write a buffer until pending reads are done)."""

    def __init__(self, source):
        self.source = iter(source)
        self.upcoming, self.fetched = None, False

    def __iter__(self):
        batch = next(self.source, None)
        while batch is not None:
            self.fetched = False
            yield batch
            self.fetch_next()
            batch = self.upcoming

    def fetch_next(self):
        if not self.fetched:
            self.upcoming, self.fetched = next(self.source, None), True


@dataclasses.dataclass(frozen=True)
class Epochs:
    """How every epoch of a run trains, complete before the first: the worker's `step` (a TrainingStep) on the
    batches of `loader` at the learning rates of `rates` (a schedule.Schedule), `iterations` an epoch
    (--benchmark-iters, else the loader's batches), a DLLogger record every `log_every` (--disp-batches); `stop`
    (rn50.launch.stop's StopRequest) asks to stop; `writer`, the checkpoint.BackgroundWriter of the files of the
    epoch before, written meanwhile: their failure stops the epoch where a stop would (stop_agreed);
    `last_state`, the run's last state, which the error of a non-finite loss names."""
    step: TrainingStep
    loader: object
    rates: schedule.Schedule
    iterations: int
    log_every: int
    dllogger: object
    stop: object
    writer: checkpoint.BackgroundWriter
    last_state: str


def train_epoch(epochs, epoch, start_batch, progress, show_first=None):
    """Run the iterations of epoch `epoch` from `start_batch` as `epochs` (an Epochs) says, its loss summed into
    `progress` (the run's saver.Progress); returns (next batch index, durations, stopped). `show_first(images,
    labels)` (the review's TrainingBatchPicture, or None) is shown the first batch, as the loader gives it.

    On a GPU the host reads the loss of the previous iteration while the current one runs: that one-step lag
    keeps the device busy (no per-iteration sync) yet catches a NaN within an iteration. On the CPU the host's
    cores are the device's: queueing the next step beside oneDNN's threads slowed ResNet-50's step by 3 to 6%
    (docs/performance.md), so the host reads each loss at once there."""
    step, iterations, every, dllogger = epochs.step, epochs.iterations, epochs.log_every, epochs.dllogger
    global_batch = epochs.loader.batch_size * step.world.size
    durations, epoch_loss, previous = [], EpochLoss(progress, epochs.last_state), None
    bar = logs.progress_bar(iterations - start_batch, f'Epoch {epoch}', step.world.rank == 0)
    step.accumulation.start_epoch(iterations)
    tick = window_start = time.time()
    iteration = start_batch
    stopped = False
    ahead = LookAhead(batches(epochs.loader, epoch, start_batch, iterations - start_batch))
    lag = step.world.devices.kind == 'gpu'
    for iteration, batch in enumerate(ahead, start_batch):
        if show_first is not None and iteration == start_batch:
            show_first(device_slices(batch.data[0], step.contexts)[0], device_slices(batch.label[0], step.contexts)[0])
        lr = epochs.rates(epoch + step.accumulation.group_start(iteration) / iterations)
        loss = step.run(batch, epoch, iteration, lr, before_sync=ahead.fetch_next)
        if previous is not None:
            epoch_loss.add(previous.asscalar(), epoch, iteration - 1, step)
        if lag:
            previous = loss
        else:
            epoch_loss.add(loss.asscalar(), epoch, iteration, step)
        now = time.time()
        durations.append(now - tick)
        tick = now
        done = iteration + 1
        if done % every == 0 or done == iterations < every:   # a short epoch logs once
            ips = every * global_batch / (now - window_start)
            window_start = now
            eta = (iterations - done) * global_batch / ips     # seconds, at this window's speed
            dllogger.log((epoch, done), {'train.loss': epoch_loss.window_mean(), 'train.ips': ips, 'train.lr': lr},
                         note=f'of {iterations} iterations, epoch ETA {logs.duration_text(eta)}')
        bar.set_postfix_str(f'{global_batch / max(np.mean(durations[-20:]), 1e-9):.1f} img/s', refresh=False)
        bar.update(1)
        if step.accumulation.at_step(done) and stop_agreed(epochs.stop, step.world, done, every, epochs.writer) \
                and done < iterations:
            stopped = True
            break
    if previous is not None:
        epoch_loss.add(previous.asscalar(), epoch, iteration, step)
    bar.close()
    return iteration + 1, durations, stopped


def stop_agreed(stop, world, done, every, writer=None):
    """Whether all workers stop now: checked every iteration alone, every `every` iterations with several
    workers (a collective per iteration would cost more than the latency it saves). A failed write of `writer`
    (a checkpoint.BackgroundWriter: a full disk under the files of the epoch before) is told in the same
    collective, and every worker raises its error there (wait_agreed): found within `every` iterations, not at
    the epoch's end, and not by rank 0 alone while the others waited for it in their next collective."""
    stop.announce()
    failed = writer is not None and writer.failed
    if world.size == 1:
        if failed:
            writer.wait()
        return stop.requested
    if done % every:
        return False
    stopping, failing = world.comm.allreduce_sum([1.0 if stop.requested else 0.0, 1.0 if failed else 0.0])
    if failing:
        writer.wait_agreed(world.comm)
    return stopping > 0


# ----------------------------------------------------------------------------------------------------------
# The run


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """What train.py hands the epoch loop beside the flags: the network `net` of this worker's `world`; `seed`,
    the run's (workers.resolve_seed), unless the state it resumes has its own; `dataset`, the run's
    contract.Dataset, whose loaders come from `loaders(dataset, rank, workers, train=..., val=..., contexts=...,
    seed=...)` (train.Loaders) once the state to start from, and so the seed that orders the data, is known;
    `network`, the nets.network.Network of `net`, and `build_network(network)`, which builds a --teacher (a
    `dataclasses.replace` of it) on the worker's devices; `dllogger`, the run's DLLogger; `stop` (rn50.launch.
    stop's StopRequest), which says when a signal asked the run to stop; `workspace`, the run's Workspace, its
    checkpoints written by a Saver."""
    net: object
    world: object
    seed: int
    dataset: object
    loaders: object
    network: object
    build_network: object
    dllogger: object
    stop: object
    workspace: object


def train(args, run):
    """--mode train / train_val of `run` (a TrainingRun): the epoch loop with validation and checkpoints; returns
    the run's saver.Progress (its `history` holds the metrics of every epoch). The library gets the flags as
    records, made here once."""
    net, world, dataset, workspace, stop = run.net, run.world, run.dataset, run.workspace, run.stop
    check_training_flags(args)
    names = prediction.class_names_of(args)   # kept in the workspace for val, pred, export and the review
    classes.keep_with_run(workspace.classes, names, args.classes or classes.dataset_file(args.data_train,
                                                                                          args.data_val) or 'this run')
    saver = Saver(workspace, world, CheckpointPolicy.of(args, RESUMED_SETTINGS))
    state = saver.start(net)
    seed = resumed_seed(state, run.seed)   # the run's from here on (report.json and its states record it)
    world.comm.broadcast_parameters(net.collect_params())
    average = ema.start_average(ema.AverageSettings.of(args), net, world, state)   # of the weights all start from
    settings = StepSettings.of(args)
    teacher = distill.Teacher(settings.teacher, run.network, run.build_network, world.devices.contexts) \
        if settings.teacher else None
    step = TrainingStep(net, world, settings, seed, teacher, average)
    if state is None:
        if args.seed is None:   # said here, not when drawn: a resumed run takes its own seed instead
            log.info('No --seed given: using seed %d', seed)
        progress = Progress(epoch=args.begin_epoch or 0)
        if getattr(run.dllogger, 'appending', False):
            # A restart without a state (the earlier run was killed before writing one): its records, now
            # redone, are superseded like those of a resumed run.
            run.dllogger.log('RESUME', {'epoch': progress.epoch, 'iteration': 0})
    else:
        progress = saver.resume(net, step, state)
        run.dllogger.log('RESUME', {'epoch': progress.epoch, 'iteration': progress.iteration})
    progress.seed = seed   # as every state records it; report.json too
    # run_start: before the loaders touch the data
    mlperf = mlperf_log.start(mlperf_log.Run.of(args, workspace), world, seed, resumed=state is not None)
    train_loader, val_loader = run.loaders(dataset, world.rank, world.size, train=True, val=args.mode == 'train_val',
                                       contexts=world.devices.contexts, seed=seed)
    if args.mode == 'train_val' and val_loader is None:
        raise RecipeError('--mode train_val needs validation data (--data-val); use --mode train to skip it')
    mlperf.data(train_loader, val_loader)
    last_epoch = args.num_epochs if args.run_epochs < 0 else min(args.num_epochs,
                                                                 progress.epoch + args.run_epochs)
    if history.target_reached(args.target_accuracy, progress.history):   # an earlier run stopped at the target
        last_epoch = progress.epoch
    if state is not None and progress.epoch >= last_epoch:
        log.info('This run is finished (%d of %d epochs): its results are in %s (report.json, model_best.params); '
                 'give a new --workspace to train again', progress.epoch, args.num_epochs,
                 os.path.abspath(workspace.folder))
    events = None if args.tensorboard is None else workspace.place(args.tensorboard)
    iterations = args.benchmark_iters or train_loader.num_batches
    dllogger = tensorboard_log.teed(events, world, run.dllogger, iterations,
                                    progress.epoch * iterations + progress.iteration)
    clock = history.WallClock(progress, world.start_time)
    validation = evaluation.Validation.of(args)
    show_first = examples.TrainingBatchPicture(workspace.training_batch, dataset.images, names,
                                               args.data_backend) if world.rank == 0 else None
    with checkpoint.BackgroundWriter() as writer:   # the files of an epoch are written while the next one trains
        epochs = Epochs(step, train_loader, schedule.Schedule.of(args), iterations, args.disp_batches, dllogger, stop,
                        writer, workspace.last_state)
        for epoch in range(progress.epoch, last_epoch):
            start_batch = progress.iteration
            if start_batch == 0:
                progress.loss_sum, progress.loss_count = 0.0, 0
            log.info('Starting epoch %d%s', epoch, '' if args.progressive_size is None else
                     ' (training at %dx%d)' % dataset.preset.training_shape(epoch)[1:])
            mlperf.epoch_start(epoch)
            next_batch, durations, stopped = train_epoch(epochs, epoch, start_batch, progress, show_first)
            show_first = None
            trained = time.time()
            writer.wait_agreed(world.comm)   # the epoch before's files, written meanwhile: an error stops all
            check_parameters(net, world, epoch, next_batch, workspace.last_state)
            loss_sum, loss_count = world.comm.allreduce_sum([progress.loss_sum, progress.loss_count])
            if stopped:
                # The state holds the sums of every worker; rank 0 alone takes them back on resume.
                progress.iteration = next_batch
                progress.loss_sum, progress.loss_count = float(loss_sum), int(loss_count)
                clock.record(progress)
                write_state(saver, net, step, progress, world, writer)
                writer.wait_agreed(world.comm)
                log.info('Stopped at epoch %d iteration %d%s', epoch, next_batch, saver.resume_note())
                mlperf.run_stop()
                return progress
            world.comm.average_copies([p.list_data() for p in net.collect_params().values() if p.grad_req == 'null'])
            mlperf.epoch_stop(epoch)
            steady = logs.steady_durations(durations)
            metrics = {'train.loss': loss_sum / max(loss_count, 1),
                       'train.ips': train_loader.batch_size * world.size / float(np.mean(steady))}
            validating = time.time()
            if val_loader is not None and evaluated(args, epoch):
                log.info('Validating epoch %d', epoch)
                mlperf.eval_start(epoch)
                val_metrics, _ = evaluation.validate(validation, net, val_loader, world)
                mlperf.eval_stop(epoch, val_metrics)
                metrics.update(val_metrics)
                metrics.update(ema.validate_average(net, step.average, val_loader, world, progress, epoch, saver,
                                                    validation, writer))
            validated = time.time()
            progress.finish_epoch(metrics)
            clock.record(progress)
            # Host memory that grows epoch after epoch is a leak (MXNet 1.9.1's LAMB kernel on GPUs: docs/training.md).
            log.info('[Epoch %d] Peak resident host memory of this worker: %.0f MiB', epoch, logs.peak_memory_mb())
            saver.save_epoch(net, epoch, metrics, progress, writer)
            write_state(saver, net, step, progress, world, writer)
            optimizer_state.check_replicas(net, step.gluon_trainer, world, epoch)
            logs.write_report(workspace.report(args.mode), vars(args), world, progress.history,
                              duration=progress.wall_seconds, seed=seed)
            log_epoch(dllogger, epoch, metrics, time.time() - trained - (validated - validating),
                      validated - validating)
            if history.target_reached(args.target_accuracy, progress.history):
                break
            if stop_agreed(stop, world, 0, 1, writer):
                log.info('Stopped after epoch %d%s', epoch, saver.resume_note())
                break
        writer.wait_agreed(world.comm)   # the last files, before the collectives that may follow the run
    clock.record(progress)   # report.json's total_duration: the training's wall time over all its resumes
    mlperf.run_stop()
    history.note_inherited_epochs(progress.history)   # which epochs the summary leaves out
    return progress


def log_epoch(dllogger, epoch, metrics, gap, validation):
    """The epoch's DLLogger record: its `metrics` and `train.epoch_gap`, the time between its last step and the
    next epoch's first besides validation (`gap`, seconds: the checks, the host copies of the files, which are
    written in the background, the replica check, the report; benchmark.py reports it beside train.ips)."""
    log.info('[Epoch %d] %.2f s between epochs besides validation (%.2f s)', epoch, gap, validation)
    dllogger.log((epoch,), dict(metrics, **{'train.epoch_gap': gap}))


def resumed_seed(state, seed):
    """The seed of the run: that of the state it resumes (`state`, a checkpoint.State, or None), else `seed`."""
    if state is None or state.meta.get('seed') is None or state.meta['seed'] == seed:
        return seed
    log.info('Using the seed of the resumed run, %d', state.meta['seed'])
    return state.meta['seed']


def check_parameters(net, world, epoch, iteration, last_state):
    """Stop with a clear error, before anything is written, when a parameter holds NaN or inf: a
    diverged run must never overwrite its last good checkpoint (`last_state`, named in the error). Every worker
    takes the same decision. On GPUs
    the check runs there (one flag read per GPU) and only a failed one copies the weights to the host to name
    them; on the CPU numpy reads them where they are (MXNet's CPU multi_all_finite took 0.6 s for ResNet-50,
    numpy 0.06 s)."""
    copies = {}
    for param in net.collect_params().values():
        for array in param.list_data():
            copies.setdefault(array.context, []).append(array)
    finite = all(losses.finite_flag(arrays).asscalar() == 1 for arrays in copies.values()) \
        if world.devices.kind == 'gpu' else None
    bad = [] if finite else checkpoint.nonfinite_parameters(net)
    if world.comm.allreduce_sum([len(bad)])[0] == 0:
        return
    total = len(net._collect_params_with_prefix())
    raise RecipeError(f'the parameters became NaN or infinite ({len(bad)} of {total} arrays, e.g. '
                      f'{bad[0] if bad else "on another worker"}) by epoch {epoch} iteration {iteration}: training '
                      f'diverged and stopped without writing a checkpoint. The last good state is '
                      f'{last_state} (if it exists); lower --lr or add --warmup-epochs')


def write_state(saver, net, step, progress, world, writer=None):
    """<prefix>_last.state by `saver` (checkpoints/saver.py: rank 0 writes it), with every worker's batchnorm
    statistics and the weight average's: collectives, every worker gathers them. A --benchmark-iters run is a
    measurement: it writes no state (and so never replaces a training run's), and it resumes none."""
    if saver.measuring:
        return
    statistics = checkpoint.worker_statistics(net, world)
    average = ema.average_state(step.average, net, world)   # a collective too
    saver.write_state(net, step, progress, statistics, average, writer)
