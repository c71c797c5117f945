"""The flags, resolved once, here and nowhere else; read-only after.

    args, origin = resolve.from_command(parser, argv)     # train.parse_flags: train.py, the runner's checks, tests
    args, origin = resolve.for_run(args, origin, on_gpu)   # train.run, once logging is set up: read-only from here

What the command line alone settles (from_command, so that the runner and the benchmarks see what train.py
will run): the class count (--num-classes, else the dataset's classes.json, else 1000), --recipe's values (a
flag given wins), the test size and resize of a recipe shrunk by --image-shape, --data-val-resize's default
(the test size x 256/224), a recipe's learning rate for the global batch, and the folder of val, pred and export
of --load's weights without --workspace (the weights' own, never the current folder).

What the run settles (for_run): what --mode val, pred and export take from the run that trained the weights
(rn50/config/trained_settings.py), the defaults that depend on the machine (--data-backend dali-gpu and --dtype
float16 with a GPU, dali-cpu and float32 without; --amp keeps the network in float32), --num-epochs' default
(90; one pass for val, pred, export and --test-io) and the warm-up's (the default's or the recipe's, halved
for a short run: rn50/optim/schedule.py). Each derived value is logged where a user would not expect it.

After for_run the namespace is a Resolved one: assigning to it raises. A part of the run that must read the
data otherwise (validation's batch on a small set, INT8 calibration) gets a copy (`replaced`), never a change.
What the process finds out (the world, devices, seed, start time) is not a flag: the records of rn50/world/
hold it (workers.World, devices.Devices). `origin` says which flags the command gave, which the recipe set,
and where the class count came from; `val_interpolation`, the one resolved value no flag names, is the validation resize's
interpolation (the trained run's in val, pred and export; else the backend's).
"""
import argparse
import dataclasses
import logging
import math
import os
import sys

from rn50.config import recipes, trained_settings
from rn50.data import classes, contract, resolution
from rn50.errors import RecipeError
from rn50.optim import schedule

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FlagSources:
    """Where the resolved values came from: `given`, the destinations of the flags the command line names;
    `from_recipe`, those --recipe set; `num_classes_source`, '--num-classes', a classes.json, the weights' run,
    or 'the default'."""
    given: frozenset = frozenset()
    from_recipe: tuple = ()
    num_classes_source: str = 'the default'


class Resolved(argparse.Namespace):
    """The flags once resolved: read like any namespace, never written."""

    def __setattr__(self, name, value):
        raise AttributeError(f'args.{name}: the flags are resolved once (rn50/config/resolve.py) and read-only '
                             'after; pass a value of the run as an argument, or use resolve.with_values')

    __delattr__ = __setattr__


def given_flags(parser, argv):
    """The destinations of the flags `argv` names explicitly (as `--flag value` or `--flag=value`)."""
    destinations = {option: action.dest for action in parser._actions for option in action.option_strings}
    named = (word.split('=', 1)[0] for word in argv)
    return frozenset(destinations[option] for option in named if option in destinations)


def from_command(parser, argv=None):
    """(args, FlagSources) of a train.py command line: parsed by `parser` (argparse's `error:` and exit 2 for a bad
    flag, and for a class count the data contradicts), then what the command alone settles."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    data_files = () if args.data_backend == 'synthetic' else (args.data_train, args.data_val)   # not read yet
    try:
        args.num_classes, num_classes_source = classes.resolve_count(args.num_classes, data_files)
    except RecipeError as e:
        parser.error(str(e))
    given = given_flags(parser, argv)
    from_recipe = recipes.values(args, given)
    for name, value in from_recipe.items():
        setattr(args, name, value)
    if args.data_val_resize is None:
        args.data_val_resize = resolution.default_val_resize(args.image_shape, args.val_image_shape)
    if args.recipe and 'lr' not in given:   # the recipe's rate for this global batch
        args.lr = recipes.learning_rate(args.recipe, args.batch_size * args.grad_accum_steps)
    args.val_interpolation = None    # the backend's, or (for_run) the trained run's
    if beside_the_weights(args, given):
        args.workspace = os.path.dirname(os.path.abspath(args.load))
    return args, FlagSources(given, tuple(from_recipe), num_classes_source)


def beside_the_weights(args, given):
    """Whether val, pred and export of --load's weights work in the weights' folder (their logs and reports, and
    the class names kept there): --workspace not given. The current folder is never written unasked."""
    return args.mode in trained_settings.INFERENCE_MODES and bool(args.load) and 'workspace' not in given


def workspace_flag(args, origin):
    """What names the run's folder, for its errors: --workspace, or --load's folder."""
    return "--load's folder (give --workspace for another)" if beside_the_weights(args, origin.given) else \
        '--workspace'



def for_run(args, origin, on_gpu):
    """(Resolved args, FlagSources) for this run on this machine (`on_gpu`: it has GPUs), the rest of what the
    module docstring lists; logs what a user should know. RecipeError for a precision the machine lacks."""
    args = argparse.Namespace(**vars(args))
    on_gpu = on_gpu and not int8_on_cpu(args)
    values, num_classes_source = trained_settings.taken_from_trained_run(args, origin.given, origin.num_classes_source)
    for name, value in values.items():
        setattr(args, name, value)
    origin = dataclasses.replace(origin, num_classes_source=num_classes_source)
    if args.data_backend is None:
        args.data_backend = default_backend(on_gpu)
        if not on_gpu:
            log.info('No GPU: --data-backend defaults to dali-cpu')
    args.val_interpolation = contract.interpolation(args.val_interpolation, args.data_backend)
    args.dtype = precision(args, on_gpu)
    # the schedule's 90 epochs; one pass for val and the loader test
    training = args.mode in ('train', 'train_val') and not args.test_io
    args.num_epochs = schedule.epochs(args.num_epochs, training)
    args.warmup_epochs = schedule.default_warmup(
        args.warmup_epochs, args.num_epochs, args.recipe if 'warmup_epochs' in origin.from_recipe else None,
        announce=args.mode in ('train', 'train_val') and not args.benchmark_iters)
    log_derived(args, origin)
    resolved = Resolved()
    vars(resolved).update(vars(args))
    return resolved, origin


def int8_on_cpu(args):
    """Whether the run is INT8 inference (--quantize int8), which runs on the CPU (oneDNN's INT8 kernels), a GPU
    node's too: its defaults are then the CPU's (float32, dali-cpu) and rn50/world/devices.py picks the CPU. An
    explicit --gpus is a RecipeError."""
    if not args.quantize:
        return False
    if args.gpus is not None:
        raise RecipeError('--quantize int8 uses oneDNN\'s INT8 kernels, which run on the CPU: leave out --gpus (a GPU '
                          'node runs it on its CPU)')
    return True


def default_backend(on_gpu):
    """--data-backend's default: DALI, on the GPU when there is one."""
    return 'dali-gpu' if on_gpu else 'dali-cpu'


def precision(args, on_gpu):
    """--dtype: as given, else float16 on GPUs and float32 on the CPU; float32 under --amp (AMP casts where it
    is safe and keeps the network in float32)."""
    if args.dtype == 'float16' and not on_gpu:
        raise RecipeError('--dtype float16 needs a GPU (MXNet has no fast float16 kernels on CPU); use '
                          '--dtype float32, or --amp for bfloat16 mixed precision on the CPU')
    if args.dtype is None and not on_gpu:
        log.info('No GPU: --dtype defaults to float32 (use --amp for bfloat16 on this CPU)')
    if args.amp:
        if args.dtype == 'float16':
            log.info('--amp: the network stays float32 and AMP casts to float16 where it is safe')
        return 'float32'
    return args.dtype or ('float16' if on_gpu else 'float32')


def log_derived(args, origin):
    """The log lines of what the recipe and the defaults derived, and where the class count came from."""
    if args.recipe:
        log.info('Recipe %s: %s', args.recipe, ', '.join(f'--{name.replace("_", "-")} {getattr(args, name)}'
                                                         for name in origin.from_recipe) or 'nothing to set')
        if args.mode in ('train', 'train_val') and recipes.size_words(args, origin.from_recipe):
            log.info('%s', recipes.size_words(args, origin.from_recipe))   # val, pred, export: the run's sizes
        recipe, batch = recipes.RECIPES[args.recipe], args.batch_size * args.grad_accum_steps
        derived = recipes.learning_rate(args.recipe, batch)
        # The runner always passes --lr, its own scaling of -l: "given" only where it is not the recipe's rate.
        given = 'lr' in origin.given and not math.isclose(args.lr, derived, rel_tol=1e-9)
        log.info('Recipe %s scales its learning rate (%g at %d images) %s: %.6g at %d images a step; --lr %.6g%s',
                 args.recipe, recipe['lr'], recipe['lr_batch'], schedule.scaling_words(recipe['lr_scaling']),
                 derived, batch, args.lr, ' (given: not the recipe\'s)' if given else '')
    if args.mode in ('train', 'train_val') and args.data_val_resize != 256 and \
            'data_val_resize' not in origin.given | set(origin.from_recipe):
        log.info('--data-val-resize %d: the test size at the original recipe\'s 256/224 (not given)',
                 args.data_val_resize)
    if beside_the_weights(args, origin.given):
        log.info('Logs and reports in %s, the folder of --load\'s weights (--workspace for another)', args.workspace)
    if origin.num_classes_source not in ('--num-classes', 'the default'):
        log.info('%d classes, as %s lists them (--num-classes not given)', args.num_classes,
                 origin.num_classes_source)


def with_values(args, **values):
    """A Resolved copy of `args` with `values` instead (the flags themselves stay as they are)."""
    copy = Resolved()
    vars(copy).update(vars(args), **values)
    return copy
