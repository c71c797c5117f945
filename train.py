"""Entry point and composer: flags, worker world, the flags resolved for it, devices, model, loaders, the mode.

Use it through the runner, which turns per-device batch and LR into global values and starts one Horovod
worker per device:

    ./runner -n 8 -b 192                                    # ImageNet, 8 GPUs, float16
    ./runner -n 1 -b 32 --dtype float32 --data-root data/demo -e 10 --image-shape 3,32,32

or directly, with global values:

    python train.py --data-train data/demo/train.rec --data-train-idx data/demo/train.idx \\
        --data-val data/demo/val.rec --data-val-idx data/demo/val.idx --batch-size 32 --lr 0.032 \\
        --num-epochs 10 --image-shape 3,32,32 --num-classes 10 --workspace runs/demo
    python train.py --data-backend synthetic --test-io     # the data loader alone, images/s

`python train.py --help` lists every flag, grouped as Run, Model, Training, Data, DALI data backend, MXNet data
backend, Augmentation, Inference, Review, MLPerf. Only this module knows every other one: rn50/config/resolve.py
(the flags, resolved once), rn50/world/ (who runs where: workers.py; on which devices: devices.py; with which
seed), models.py (the network, built of rn50/nets/network.py's record), data.py / dali.py / rn50/data/synthetic.py
(the loaders), fit.py (training), rn50/inference/ (validation, prediction, INT8, export), rn50/checkpoints/ and
rn50/reports/ (files). The library under rn50/ never sees the flags' namespace: this module and fit.py hand it
records made once from the resolved flags (the `of(args)` adapters beside the code they feed: contract.Dataset,
Network, evaluation.InferenceSetup, export.Export, ...). The modes:

    train_val, train   fit.train              (validation every epoch in train_val)
    val                evaluation.evaluate
    pred               prediction.predict
    export             export.export
    --test-io          data.measure_loader    (reads the data alone)

A problem the user can fix (bad flags, missing files, no GPU for a GPU-only request) is printed as
`error: ...` without a traceback, exit status 2.
"""
import functools
import logging
import os
import sys
import time

from rn50.world import cpu
if __name__ == '__main__':   # the program, not an import by the runner or a test
    from rn50.launch import interpreter
    interpreter.use_project_python()   # a fresh shell: the project's .venv
    cpu.prepare_process()           # oneDNN's ISA and OpenMP threads, before MXNet loads
    cpu.load_mxnet()                # without scikit-learn

import mxnet as mx  # noqa: E402  (after cpu.prepare_process: oneDNN and OpenMP read the environment once)

import dali  # noqa: E402
import data  # noqa: E402
import fit  # noqa: E402
import models  # noqa: E402
from rn50 import files  # noqa: E402
from rn50.checkpoints.workspace import Workspace  # noqa: E402
from rn50.checkpoints import resume, weight_loading  # noqa: E402
from rn50 import flags  # noqa: E402
from rn50.config import resolve, run_flags  # noqa: E402
from rn50.data import augment, contract, synthetic  # noqa: E402
from rn50.errors import RecipeError  # noqa: E402
from rn50.inference import evaluation, export, prediction# noqa: E402
from rn50.launch.stop import StopRequest  # noqa: E402
from rn50.nets.network import Network  # noqa: E402
from rn50.reports import logs, mlperf_log, tensorboard_log  # noqa: E402
from rn50.review import compose, outcomes  # noqa: E402
from rn50.training.history import training_summary  # noqa: E402
from rn50.world import devices, memory, workers  # noqa: E402

log = logging.getLogger(__name__)


def build_parser():
    parser = flags.ArgumentParser(prog='train.py', description='Train, validate or run ResNet-50 v1.5 and relatives')
    run_flags.add_args(parser)
    models.add_model_args(parser)
    fit.add_fit_args(parser)
    data.add_data_args(parser)
    dali.add_dali_args(parser)
    data.add_data_aug_args(parser)
    augment.add_args(parser)
    evaluation.add_inference_args(parser)
    compose.add_args(parser)
    mlperf_log.add_args(parser)
    return parser


def parse_flags(argv=None):
    """(args, origin): train.py's flags as the command line alone settles them (rn50/config/resolve.py); the
    runner's checks, the benchmarks and the tests parse with it too."""
    return resolve.from_command(build_parser(), argv)


class Loaders:
    """The loaders of a run's --data-backend (`backend`, with the native backend's and DALI's own Options), as the
    library asks for them: loaders(dataset, rank, workers, train=..., val=..., contexts=..., seed=...) -> (train
    loader or None, val loader or None) of `dataset` (a contract.Dataset) for worker `rank` of `workers`, placing
    batches on `contexts` (the worker's devices) and drawing from `seed` (the run's; None: `default_seed`, --seed's,
    0 when not given); None where not asked for or where there is no data (no --data-val means no validation
    loader)."""

    def __init__(self, backend, native=data.Options(), dali_options=dali.Options(), default_seed=0):
        self.backend, self.native, self.dali, self.default_seed = backend, native, dali_options, default_seed

    @classmethod
    def of(cls, args):
        return cls(args.data_backend, data.Options.of(args), dali.Options.of(args), args.seed or 0)

    def __call__(self, dataset, rank=0, num_workers=1, train=True, val=True, contexts=(mx.cpu(),), seed=None):
        if self.backend in ('dali-gpu', 'dali-cpu'):
            make = functools.partial(dali.DaliLoader, dataset, self.dali)
        elif self.backend == 'synthetic':
            make = functools.partial(synthetic.SyntheticLoader, dataset)
        else:
            make = functools.partial(data.RecordLoader, dataset, self.native)
        seed = self.default_seed if seed is None else seed
        has_val = self.backend == 'synthetic' or dataset.val[0]
        train_loader = make(rank, num_workers, True, contexts, seed) if train else None
        val_loader = make(rank, num_workers, False, contexts, seed) if val and has_val else None
        return train_loader, val_loader


def get_loaders(args, rank=0, num_workers=1, train=True, val=True, contexts=(mx.cpu(),), seed=None):
    """Loaders.of(args)'s loaders of the resolved flags' data (contract.Dataset.of(args)), for a caller that has
    the flags (the tests, the scripts): (train loader or None, val loader or None)."""
    return Loaders.of(args)(contract.Dataset.of(args), rank, num_workers, train, val, contexts, seed)


def check_inference_flags(args):
    """RecipeError for inference flags that cannot work with the mode, and for a class-name file pred cannot
    use. INT8 runs on the CPU, a GPU node's too (rn50/config/resolve.py). The runner checks them too."""
    if args.mode == 'pred' and not args.test_io:
        prediction.class_names_of(args)
    if args.triton and args.mode != 'export':
        raise RecipeError(f'--triton writes a model repository in --mode export, not --mode {args.mode}')
    if args.quantize is None:
        return
    if args.mode not in ('val', 'pred'):
        raise RecipeError(f'--quantize int8 is for --mode val and pred (INT8 inference), not --mode {args.mode}; '
                          'to deploy the INT8 model, run --mode val --quantize int8 and use the '
                          f'{args.model_prefix}_int8-symbol.json/-0000.params it saves')
    if args.amp or args.dtype != 'float32':
        raise RecipeError('--quantize int8 starts from the float32 network: leave out --amp and use '
                          '--dtype float32')
    if args.data_backend != 'synthetic' and not args.data_train:
        raise RecipeError('--quantize int8 calibrates on the training set: pass --data-train (or --data-root '
                          'to the runner)')


def run_mode(args, network, net, world, seed, dllogger, stop, workspace, dataset):
    """Run args.mode (or --test-io) on `net` (built of `network`, the run's nets.network.Network) with the run's
    `dataset` (a contract.Dataset), write its report (in `workspace`) and the DLLogger summary."""
    loaders = Loaders.of(args)
    if args.test_io:
        pair = loaders(dataset, world.rank, world.size, train=args.test_io_mode == 'train',
                       val=args.test_io_mode == 'val', contexts=world.devices.contexts, seed=seed)
        data.measure_loader(args, pair[args.test_io_mode == 'val'], world, dllogger)
        return
    if args.mode == 'export':
        summary = export.export(export.Export.of(args), network, world, workspace, dataset, loaders,
                                functools.partial(models.build, device='cpu'),
                                functools.partial(dali.serialize_preprocessing, dataset.images,
                                                  args.dali_validation_threads))
        logs.write_report(workspace.report(args.mode), vars(args), world, [], summary, seed=seed)
        return
    validation = evaluation.Validation.of(args)
    if args.mode in ('val', 'pred'):
        net = evaluation.inference_network(net, world, evaluation.InferenceSetup.of(args), workspace, dataset, loaders)
    if args.mode == 'pred':
        prediction.predict(net, world, prediction.Prediction.of(args), validation, dataset.images, workspace,
                          dali.PredictionImages)
        return
    reviewed = reviewing(args)
    if args.mode == 'val':
        summary, history, table = evaluation.evaluate(net, world, seed, dataset, loaders, dllogger, validation,
                                                     args.num_epochs, outcomes.OutcomeTable if reviewed else None)
        review = review_run(args, world, dataset, workspace, table,
                            resume.describe_weights(resume.find_weights(workspace, args.load))) if reviewed else None
    else:
        build_network = functools.partial(models.build, device=world.devices.kind)   # for a --teacher
        progress = fit.train(args, fit.TrainingRun(net, world, seed, dataset, loaders, network, build_network,
                                                   dllogger, stop, workspace))
        history, duration, seed = progress.history, progress.wall_seconds, progress.seed
        summary = training_summary(history, args.target_accuracy)
        # the MLPerf result log's status and time to train
        summary.update(mlperf_log.summary(mlperf_log.log_path(args.mlperf_log, workspace)))
        review = None
        if reviewed and not stop.requested:
            table = best_outcomes(net, world, seed, dataset, loaders, validation, workspace) \
                if args.mode == 'train_val' else None
            trained = resume.describe_weights(workspace.best_params if table is not None else workspace.last_state)
            review = review_run(args, world, dataset, workspace, table, trained, history)
    logs.write_report(workspace.report(args.mode), vars(args), world, history, summary,
                      duration=duration if args.mode in ('train', 'train_val') else None, seed=seed, review=review)
    mx.nd.waitall()
    dllogger.log((), summary)
    log.info('Done in %.1f s; peak memory %.0f MB. Outputs in %s', time.time() - world.start_time,
             logs.peak_memory_mb(), os.path.abspath(args.workspace))


def reviewing(args):
    """Whether the run ends with a review of what the model learned (report.html, report_val.html; rn50/review/):
    every run of real data but a measurement (--benchmark-iters, --no-metrics, --test-io), unless --no-review."""
    return args.mode in ('train', 'train_val', 'val') and args.data_backend != 'synthetic' and \
        not (args.benchmark_iters or args.no_metrics or args.test_io or args.no_review)


def best_outcomes(net, world, seed, dataset, loaders, validation, workspace):
    """The outcomes of the weights a training run keeps as its best (model_best.params, loaded into `net`, the run
    being over) over the whole validation set, gathered from every worker; None when there are none."""
    if not os.path.exists(workspace.best_params):
        log.info('No %s: the review shows the curves alone', workspace.best_params)
        return None
    weight_loading.load_weights(net, workspace.best_params, dataset.images.mean, dataset.images.std)
    _, val_loader = loaders(dataset, world.rank, world.size, train=False, val=True, contexts=world.devices.contexts,
                            seed=seed)
    table = outcomes.OutcomeTable(val_loader.num_examples)
    evaluation.validate(validation, net, val_loader, world, f' of {os.path.basename(workspace.best_params)}', table)
    return table.gathered(world.comm)


def review_run(args, world, dataset, workspace, table, trained, history=()):
    """Rank 0 writes the run's review (rn50/review/compose.py: report.html, report_val.html) of `table`, the
    gathered outcomes of the weights `trained` (resume.TrainedWeights; None: no validation), and returns it for
    report.json."""
    if world.rank != 0:
        return None
    return compose.review_run(compose.Subject.of(args, prediction.class_names_of(args)),
                              workspace.review_page(args.mode), table, trained, history,
                              prediction.image_reader(dataset.images, dali.PredictionImages).prepare,
                              workspace.training_batch)


def run(args, origin):
    """Everything after parsing: world, the flags resolved for it, hardware, checks, model, then the mode."""
    fit.check_schedule_flags(args, origin)
    # Training catches SIGTERM/SIGUSR1 from the start, so a signal during start-up stops it cleanly too.
    stop = StopRequest() if args.mode in ('train', 'train_val') and not args.test_io else None
    start_time = time.time()
    comm = workers.Communicator.start(
        args.kv_store, load_first=[tensorboard_log.WRITER_MODULE] if args.tensorboard is not None else [])
    workspace = Workspace.of(args)    # the run's folder and files, made once
    resume.check_weights_source(args.mode, args.workspace, args.load, args.finetune, args.teacher,
                                speed_only=args.mode == 'val' and args.no_metrics)
    files.check_workspace(args.workspace, resolve.workspace_flag(args, origin))
    if args.logdir:
        files.check_workspace(args.logdir, '--logdir')
    logs.setup_logging(workspace.place(args.log), comm.rank)
    if comm.rank == 0:
        workspace.clean()
    args, origin = resolve.for_run(args, origin, on_gpu=mx.context.num_gpus() > 0)
    world = workers.World(comm, devices.resolve_devices(comm, devices.DeviceRequest.of(args)), start_time)
    if world.devices.kind == 'cpu':
        log.info('CPU: %s; %s', cpu.identity(), cpu.describe())
    data.check_backend(args, origin.given, on_gpu=world.devices.kind == 'gpu')
    check_inference_flags(args)
    dataset = contract.Dataset.of(args)   # the run's data, its images and training augmentation, made once
    network = Network.of(args)    # the network's settings, made once
    net = models.build(network, world.devices.kind)
    memory.check_batch_fits(net, world, args.batch_size, dataset.images, args.dtype, args.mode, args.test_io)
    dllogger_path = os.path.join(args.logdir or args.workspace, args.dllogger_log)
    dllogger = logs.DLLogger(dllogger_path if world.rank == 0 else None, echo=world.rank == 0,
                             stream=sys.stderr if args.mode == 'pred' else None)   # stdout: the predictions
    dllogger.log('PARAMETER', vars(args))
    try:
        seed = workers.resolve_seed(args.seed, world)
        net.initialize(ctx=list(world.devices.contexts))
        net.hybridize(static_alloc=True, static_shape=True)
        run_mode(args, network, net, world, seed, dllogger, stop, workspace, dataset)
    finally:
        dllogger.close()


def main(argv=None):
    args, origin = parse_flags(argv)
    try:
        run(args, origin)
    except RecipeError as e:
        logging.getLogger(__name__).debug('RecipeError', exc_info=True)
        print(f'error: {e}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # a second Ctrl-C during training, or one before training catches signals
        print('error: interrupted: stopped at once, without writing a state (one Ctrl-C stops cleanly once '
              'training has started)', file=sys.stderr)
        return 130
    return 0


if __name__ == '__main__':
    sys.exit(main())
