"""Entry point and composer: flags, worker world, hardware, model, data loaders, then the mode.

Use it through the runner, which turns per-device batch and LR into global values and starts one Horovod
worker per device:

    ./runner -n 8 -b 192                                    # ImageNet, 8 GPUs, float16
    ./runner -n 1 -b 32 --dtype float32 --data-root data/demo -e 10 --image-shape 3,32,32

or directly, with global values:

    python train.py --data-train data/demo/train.rec --data-train-idx data/demo/train.idx \\
        --data-val data/demo/val.rec --data-val-idx data/demo/val.idx --batch-size 32 --lr 0.032 \\
        --num-epochs 10 --image-shape 3,32,32 --num-classes 10 --workspace runs/demo
    python train.py --data-backend synthetic --test-io     # the data loader alone, images/s

`python train.py --help` lists every flag, grouped as Run, Model, Training, Data, DALI, MXNet augmentation,
Augmentation, Inference, MLPerf. Only this module knows every other one: workers.py (who runs where, in
which precision), models.py (the network), data.py / dali.py / synthetic.py (the loaders), fit.py (training), inference.py
(validation, prediction, INT8, export), checkpoint.py and logs.py (files). The modes:

    train_val, train   fit.train         (validation every epoch in train_val)
    val                inference.evaluate
    pred               inference.predict
    export             export.export
    --test-io          measure_loader    (reads the data alone)

A problem the user can fix (bad flags, missing files, no GPU for a GPU-only request) is printed as
`error: ...` without a traceback, exit status 2.
"""
import argparse
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

import mxnet as mx  # noqa: E402  (after cpu.prepare_process: oneDNN and OpenMP read the environment once)
import numpy as np  # noqa: E402

from rn50.data import augment  # noqa: E402
from rn50.checkpoints import checkpoint  # noqa: E402
from rn50.data import classes  # noqa: E402
import dali  # noqa: E402
import data  # noqa: E402
from rn50.inference import export  # noqa: E402
import fit  # noqa: E402
from rn50.config import flags  # noqa: E402
from rn50.inference import inference  # noqa: E402
from rn50.reports import logs  # noqa: E402
from rn50.world import memory  # noqa: E402
from rn50.reports import mlperf_log  # noqa: E402
import models  # noqa: E402
from rn50.config import recipes  # noqa: E402
from rn50.launch.stop import StopRequest  # noqa: E402
from rn50.data import resolution  # noqa: E402
from rn50.data import synthetic  # noqa: E402
from rn50.config import trained_settings  # noqa: E402
from rn50.world import workers  # noqa: E402
from rn50.errors import RecipeError  # noqa: E402
from rn50.data import contract

log = logging.getLogger(__name__)


def add_run_args(parser):
    group = parser.add_argument_group('Run', 'what to run, where, and where the outputs go')
    group.add_argument('--mode', default='train_val', choices=['train_val', 'train', 'val', 'pred', 'export'],
                       help='train_val trains and validates every epoch; train only trains (checkpoints are '
                            'still written); val validates a checkpoint; pred classifies --data-pred; export writes '
                            'symbol+params and ONNX')
    group.add_argument('--recipe', default=None, choices=sorted(recipes.RECIPES),
                       help='set the values of a published recipe (recipes.py: ' + '; '.join(
                           f'{name}: {recipe["about"]}' for name, recipe in sorted(recipes.RECIPES.items()))
                       .replace('%', '%%') + '); flags given on the command line win')
    group.add_argument('--seed', type=flags.integer(minimum=0, maximum=workers.MAX_SEED), default=None,
                       help='random seed for initialisation, data order, augmentation and mixup (default: a '
                            'random one, logged and stored in the checkpoint so a resume continues exactly)')
    group.add_argument('--gpus', type=flags.int_list, default=None,
                       help='list of gpus to run, e.g. 0 or 0,2,5; with --kv-store horovod each worker takes '
                            'gpus[local rank] (default: every GPU this process sees, so one process with --kv-store '
                            'device splits --batch-size over all of them; the CPU on a machine without GPUs). The '
                            'log names the GPUs and the images per GPU')
    group.add_argument('--kv-store', default='device', choices=['device', 'horovod'],
                       help='horovod: one process per device (use the runner); device: one process drives '
                            'every device in --gpus')
    group.add_argument('--dtype', default=None, choices=['float32', 'float16'],
                       help='precision of weights and data (default: float16 on GPU, float32 on CPU)')
    group.add_argument('--amp', action='store_true',
                       help='automatic mixed precision (mxnet.contrib.amp): float16 on GPU with dynamic loss '
                            'scaling, bfloat16 on CPU; weights stay float32')
    group.add_argument('--batch-size', type=flags.integer(minimum=1), default=192,
                       help='the GLOBAL batch size (all workers)')
    group.add_argument('--load', default=None,
                       help='checkpoint to start from: a .params file (weights) or a .state file (exact '
                            'resume); default: the workspace\'s last state, if any')
    group.add_argument('--test-io', action='store_true', help='measure the data loader alone, images/s')
    group.add_argument('--test-io-mode', default='train', choices=['train', 'val'],
                       help='which data --test-io reads')
    group.add_argument('--no-metrics', action='store_true',
                       help='do not compute accuracy (for benchmarking)')
    group.add_argument('--benchmark-iters', type=flags.integer(minimum=1), default=None,
                       help='run only this many iterations per epoch, wrapping around the data if needed')
    group.add_argument('--workspace', default='./', help='directory for checkpoints, logs and report.json')
    group.add_argument('--log', default='log.log',
                       help='human-readable log file (relative paths are in the workspace)')
    group.add_argument('--dllogger-log', default='dllogger_log.log',
                       help='DLLogger JSON-lines file (relative paths are in --logdir, else the workspace)')
    group.add_argument('--logdir', default=None, help='directory for the DLLogger file')
    return group


class TrainParser(argparse.ArgumentParser):
    """train.py's parser, which also settles what the flags leave to the data: the class count (--num-classes,
    else the dataset's classes.json, else 1000), so every caller (workers, the runner's checks, benchmarks,
    tests) sees the same resolved flags. `args.num_classes_source` says where the count came from."""

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        data_files = () if parsed.data_backend == 'synthetic' else (parsed.data_train, parsed.data_val)   # unread
        try:
            parsed.num_classes, parsed.num_classes_source = classes.resolve_count(parsed.num_classes, data_files)
        except RecipeError as e:
            self.error(str(e))
        parsed.given_flags = trained_settings.given_flags(self, sys.argv[1:] if args is None else list(args))
        parsed.recipe_flags = recipes.apply(parsed, parsed.given_flags)
        if parsed.data_val_resize is None:
            parsed.data_val_resize = resolution.default_val_resize(parsed)
        if parsed.recipe and 'lr' not in parsed.given_flags:   # the recipe's rate for this global batch
            parsed.lr = recipes.learning_rate(parsed.recipe, parsed.batch_size * parsed.grad_accum_steps)
        return parsed, rest


def build_parser():
    parser = TrainParser(description='Train, validate or run ResNet-50 v1.5 and relatives',
                         formatter_class=flags.HelpFormatter)
    add_run_args(parser)
    models.add_model_args(parser)
    fit.add_fit_args(parser)
    data.add_data_args(parser)
    dali.add_dali_args(parser)
    data.add_data_aug_args(parser)
    augment.add_args(parser)
    inference.add_inference_args(parser)
    mlperf_log.add_args(parser)
    return parser


def get_loaders(args, rank=0, num_workers=1, train=True, val=True):
    """(train loader or None, val loader or None) of args.data_backend for worker `rank` of `num_workers`;
    None where not asked for or where there is no data (no --data-val means no validation loader)."""
    if args.data_backend in ('dali-gpu', 'dali-cpu'):
        make = dali.DaliLoader
    else:
        make = synthetic.SyntheticLoader if args.data_backend == 'synthetic' else data.RecordLoader
    has_val = args.data_backend == 'synthetic' or args.data_val
    train_loader = make(args, rank, num_workers, training=True) if train else None
    val_loader = make(args, rank, num_workers, training=False) if val and has_val else None
    return train_loader, val_loader


def measure_loader(args, world, dllogger):
    """--test-io: read the data alone for --num-epochs epochs (default 1) and report images/s."""
    train_loader, val_loader = get_loaders(args, world.rank, world.size, train=args.test_io_mode == 'train',
                                           val=args.test_io_mode == 'val')
    loader = train_loader if args.test_io_mode == 'train' else val_loader
    if loader is None:
        raise RecipeError(f'--test-io-mode {args.test_io_mode} needs --data-{args.test_io_mode}')
    iterations = args.benchmark_iters or loader.num_batches
    rates = []
    for epoch in range(args.num_epochs):
        durations = []
        tick = time.time()
        for i, batch in enumerate(contract.batches(loader, epoch, 0, iterations), 1):
            images = batch.data[0]
            for part in images if isinstance(images, list) else [images]:     # one slice per device, or one array
                part.wait_to_read()
            now = time.time()
            durations.append(now - tick)
            tick = now
            if i % args.disp_batches == 0:
                log.info('Batch [%d] Speed: %.1f samples/sec', i,
                         loader.batch_size * world.size / np.mean(durations[-args.disp_batches:]))
        rate = loader.batch_size * world.size / float(np.mean(logs.steady_durations(durations)))
        rates.append(rate)
        dllogger.log((epoch,), {f'{args.test_io_mode}.ips': rate})
    dllogger.log((), {f'{args.test_io_mode}.ips': float(np.mean(rates))})


def run_mode(args, net, world, dllogger, stop):
    """Run args.mode (or --test-io) on `net`, write its report and the DLLogger summary."""
    if args.test_io:
        measure_loader(args, world, dllogger)
        return
    if args.mode == 'export':
        summary = export.export(args, world, get_loaders, functools.partial(models.build, args))
        logs.write_report(args, world.rank, world.size, [], summary)
        return
    if args.mode in ('val', 'pred'):
        net = inference.inference_network(args, net, world, get_loaders)
    if args.mode == 'pred':
        inference.predict(args, net, dali.PredictionImages)
        return
    if args.mode == 'val':
        summary, history = inference.evaluate(args, net, world, get_loaders, dllogger)
    else:
        meta = fit.train(args, net, world, get_loaders, functools.partial(models.build, args), dllogger, stop)
        history, duration = meta['history'], meta['wall_seconds']
        summary = fit.training_summary(history, args.target_accuracy)
        summary.update(mlperf_log.summary(args))   # the MLPerf result log's status and time to train
    logs.write_report(args, world.rank, world.size, history, summary,
                      duration=duration if args.mode in ('train', 'train_val') else None)
    mx.nd.waitall()
    dllogger.log((), summary)
    log.info('Done in %.1f s; peak memory %.0f MB. Outputs in %s', time.time() - args.start_time,
             logs.peak_memory_mb(), os.path.abspath(args.workspace))


def check_weights_folder(args):
    """val, pred and export without --load take their weights from --workspace: a mistyped one is an error, not
    a new empty folder (a --no-metrics speed measurement may run on random weights, see inference.py)."""
    speed_only = args.mode == 'val' and args.no_metrics
    if args.mode in ('val', 'pred', 'export') and not (args.load or speed_only) and not os.path.isdir(args.workspace):
        raise RecipeError(f'--workspace {args.workspace} does not exist, and --mode {args.mode} takes its weights '
                          'from the workspace: give the folder of a training run, or --load a checkpoint')
    # Before anything is written: a failed start leaves no log files behind.
    if args.load and not os.path.isfile(args.load):
        raise RecipeError(f'--load {args.load}: no such file')
    if args.teacher is not None and args.mode not in ('train', 'train_val'):
        raise RecipeError(f'--teacher distils while training: --mode {args.mode} does not train')
    if args.teacher is not None and not os.path.isfile(args.teacher):
        raise RecipeError(f'--teacher {args.teacher}: no such file')
    if args.finetune and not args.load:
        raise RecipeError('--finetune fine-tunes the weights of --load, and none was given: add --load WEIGHTS (see '
                          'the README\'s "Bring your own weights" for where ImageNet weights come from), or leave '
                          '--finetune out to train from scratch')


def run(args):
    """Everything after parsing: world, hardware, checks, model, then the mode."""
    args.start_time = time.time()
    fit.check_schedule_flags(args)
    # Training catches SIGTERM/SIGUSR1 from the start, so a signal during start-up stops it cleanly too.
    stop = StopRequest() if args.mode in ('train', 'train_val') and not args.test_io else None
    world = workers.World(args.kv_store)
    check_weights_folder(args)
    logs.check_workspace(args.workspace)
    if args.logdir:
        logs.check_workspace(args.logdir, '--logdir')
    logs.setup_logging(logs.in_workspace(args, args.log), world.rank)
    if world.rank == 0:
        checkpoint.clean_workspace(args)
    trained_settings.inherit(args)
    if args.recipe:
        log.info('Recipe %s: %s', args.recipe, ', '.join(f'--{name.replace("_", "-")} {getattr(args, name)}'
                                                         for name in args.recipe_flags) or 'nothing to set')
        if args.mode in ('train', 'train_val') and recipes.size_words(args):   # val, pred, export: the run's sizes
            log.info('%s', recipes.size_words(args))
        recipe, batch = recipes.RECIPES[args.recipe], args.batch_size * args.grad_accum_steps
        log.info('Recipe %s scales its learning rate (%g at %d images) %s: %.6g at %d images a step; --lr %.6g%s',
                 args.recipe, recipe['lr'], recipe['lr_batch'], recipes.scaling_words(recipe['lr_scaling']),
                 recipes.learning_rate(args.recipe, batch), batch, args.lr,
                 ' (given)' if 'lr' in args.given_flags else '')
    if args.mode in ('train', 'train_val') and args.data_val_resize != 256 and \
            'data_val_resize' not in set(args.given_flags) | set(args.recipe_flags):
        log.info('--data-val-resize %d: the test size at the original recipe\'s 256/224 (not given)',
                 args.data_val_resize)
    workers.resolve_hardware(args, world)
    if args.device == 'cpu':
        log.info('CPU: %s; %s', cpu.cpuinfo_field('model name') or 'unknown model', cpu.describe())
    if args.num_classes_source not in ('--num-classes', 'the default'):
        log.info('%d classes, as %s lists them (--num-classes not given)', args.num_classes,
                 args.num_classes_source)
    data.resolve_backend(args)
    inference.check_inference_flags(args)
    net = models.get_model(**models.model_options(args))
    memory.check_batch_fits(args, net, world)
    if args.num_epochs is None:   # the schedule's 90 epochs; one pass for val and the loader test
        args.num_epochs = 1 if args.mode in ('val', 'pred', 'export') or args.test_io else fit.DEFAULT_EPOCHS
    args.warmup_epochs = fit.default_warmup(args)     # the default's or a recipe's, shortened to fit the run
    dllogger_path = os.path.join(args.logdir or args.workspace, args.dllogger_log)
    dllogger = logs.DLLogger(dllogger_path if world.rank == 0 else None, echo=world.rank == 0,
                             stream=sys.stderr if args.mode == 'pred' else None)   # stdout: the predictions
    dllogger.log('PARAMETER', {k: v for k, v in vars(args).items() if k not in ('contexts', 'start_time')})
    try:
        workers.resolve_seed(args, world)
        net.initialize(ctx=args.contexts)
        net.hybridize(static_alloc=True, static_shape=True)
        run_mode(args, net, world, dllogger, stop)
    finally:
        dllogger.close()


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        run(args)
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
