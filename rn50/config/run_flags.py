"""The Run group of train.py's flags: what to run, where, and where the outputs go (the other groups live with
the code that reads them: models.py's Model, fit.py's Training, data.py's Data, dali.py's DALI, ...).

    run_flags.add_args(parser)     # train.build_parser
"""
from rn50 import flags
from rn50.config import recipes

# --seed's largest value: MXNet seeds are 32-bit signed integers and worker r seeds with seed + r
# (workers.resolve_seed): room for 65,536 workers.
MAX_SEED = 2**31 - 1 - 65536


def add_args(parser):
    group = parser.add_argument_group('Run', 'what to run, where, and where the outputs go')
    group.add_argument('--mode', default='train_val', choices=['train_val', 'train', 'val', 'pred', 'export'],
                       help='train_val trains and validates every epoch; train only trains (checkpoints are '
                            'still written); val validates a checkpoint; pred classifies --data-pred; export writes '
                            'symbol+params and ONNX')
    group.add_argument('--recipe', default=None, choices=sorted(recipes.RECIPES),
                       help='set the values of a published recipe (recipes.py: ' + '; '.join(
                           f'{name}: {recipe["about"]}' for name, recipe in sorted(recipes.RECIPES.items()))
                       .replace('%', '%%') + '); flags given on the command line win')
    group.add_argument('--seed', type=flags.integer(minimum=0, maximum=MAX_SEED), default=None,
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
