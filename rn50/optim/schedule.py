"""The learning rate schedule, all of it: its flags, its defaults (the length, the warm-up), its checks, the rule
that scales a rate with the batch, and the rate itself, a pure function of the position in training.

    schedule.add_args(group)                              # fit.py's Training group: --lr ... --warmup-prefix
    rates = schedule.Schedule.of(args)                    # once, from the resolved flags (fit.train)
    lr = rates(epoch + iteration / iterations)            # per iteration: learning_rate(progress, ...)
    lr = schedule.learning_rate(progress, base_lr=0.1, num_epochs=90, warmup_epochs=5)

rn50/config/resolve.py resolves --num-epochs (`epochs`) and --warmup-epochs (`default_warmup`) with it; fit.py
checks the flags before anything starts (`check`); recipes.py and the runner scale a rate to a batch
(`scaled_lr`).
"""
import dataclasses
import logging
import math

from rn50 import flags
from rn50.errors import RecipeError

log = logging.getLogger(__name__)

DEFAULT_EPOCHS = 90
DEFAULT_WARMUP_EPOCHS = 5
KINDS = ('multistep', 'cosine', 'poly')


def add_args(group):
    """The schedule's flags, in fit.py's Training group (--num-epochs, the schedule's length, is fit.py's: it is
    also val's number of passes)."""
    group.add_argument('--lr', type=flags.real(minimum=0, exclusive=True), default=0.1,
                       help='peak learning rate (the runner scales it)')
    group.add_argument('--lr-schedule', default='cosine', choices=list(KINDS),
                       help='learning rate schedule after the warmup (poly: MLPerf\'s polynomial decay to --end-lr)')
    group.add_argument('--lr-poly-power', type=flags.real(minimum=0, exclusive=True), default=2.0,
                       help='poly: the power of the decay')
    group.add_argument('--end-lr', type=flags.real(minimum=0), default=0.0001,
                       help='poly: the learning rate at --num-epochs')
    group.add_argument('--lr-factor', type=flags.real(minimum=0, exclusive=True), default=0.256,
                       help='the ratio to reduce lr on each step (multistep) or cosine segment')
    group.add_argument('--lr-steps', type=flags.float_list, default=[],
                       help='the epochs to reduce the lr, in increasing order, e.g. 30,60')
    group.add_argument('--warmup-epochs', type=flags.real(minimum=0), default=None,
                       help=f'epochs of linear warmup from 0 to --lr (default {DEFAULT_WARMUP_EPOCHS:g}, or half of '
                            'a shorter run: the log says so); at most --num-epochs')
    group.add_argument('--warmup-prefix', type=int, default=1, choices=(0, 1), help='1 (default): the decay (cosine, '
                       'poly) spans the epochs after the warm-up (the original recipe\'s); 0: all epochs, from 0, '
                       'the warm-up replacing its first part (timm\'s CosineLRScheduler, warmup_prefix False)')


def learning_rate(progress, base_lr, num_epochs, warmup_epochs=0, schedule='cosine', steps=(), factor=0.1,
                  power=2.0, end_lr=0.0001, warmup_prefix=True):
    """The learning rate at `progress` = epoch + iteration / iterations_per_epoch (a pure function).

    Linear warmup from 0 over `warmup_epochs`, then either
    - cosine: half a cosine from base_lr to 0 at num_epochs; with `steps`, the span is cut into segments at
      those epochs and each segment k restarts the cosine from base_lr * factor**k;
    - multistep: base_lr * factor**(number of steps <= progress);
    - poly (MLPerf's): end_lr + (base_lr - end_lr) * (1 - (progress - warmup) / (num_epochs - warmup))**power,
      from base_lr after the warmup to end_lr at num_epochs.
    With `warmup_prefix` (the original recipe's) the decay spans the epochs after the warm-up, as above; without
    it (timm's default, warmup_prefix=False) the decay is a function of the epoch from 0 to num_epochs (warmup
    read as 0 in the formulas) and the warm-up replaces its first part, ending at the peak.
    """
    if progress >= num_epochs:
        return end_lr if schedule == 'poly' else 0.0
    decays = sum(1 for s in steps if s <= progress)
    if progress < warmup_epochs:
        scale = factor ** decays if schedule == 'multistep' else 1.0
        return base_lr * scale * progress / warmup_epochs
    if schedule == 'multistep':
        return base_lr * factor ** decays
    start = warmup_epochs if warmup_prefix else 0
    if schedule == 'poly':
        remaining = 1 - (progress - start) / (num_epochs - start)
        return end_lr + (base_lr - end_lr) * remaining ** power
    bounds = [start] + [s for s in steps if start < s < num_epochs] + [num_epochs]
    segment = max(k for k in range(len(bounds) - 1) if bounds[k] <= progress)
    start, end = bounds[segment], bounds[segment + 1]
    return base_lr * factor ** segment * 0.5 * (1 + math.cos(math.pi * (progress - start) / (end - start)))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A run's schedule as values (`of`: from the resolved flags); called with the position in training, it gives
    learning_rate's rate there."""
    base_lr: float
    num_epochs: int
    warmup_epochs: float = 0
    kind: str = 'cosine'
    steps: tuple = ()
    factor: float = 0.1
    power: float = 2.0
    end_lr: float = 0.0001
    warmup_prefix: bool = True

    # The flags a resumed run must keep as its state recorded them (fit.RESUMED_SETTINGS): the whole schedule but
    # the rate, which the runner scales with the global batch (resume.check_same_run compares it at the same one).
    RESUMED = ('num_epochs', 'lr_schedule', 'lr_steps', 'lr_factor', 'warmup_epochs', 'lr_poly_power', 'end_lr',
               'warmup_prefix')

    @classmethod
    def of(cls, args):
        return cls(base_lr=args.lr, num_epochs=args.num_epochs, warmup_epochs=args.warmup_epochs,
                   kind=args.lr_schedule, steps=tuple(args.lr_steps), factor=args.lr_factor,
                   power=args.lr_poly_power, end_lr=args.end_lr, warmup_prefix=bool(args.warmup_prefix))

    def __call__(self, progress):
        return learning_rate(progress, self.base_lr, self.num_epochs, self.warmup_epochs, self.kind, self.steps,
                             self.factor, self.power, self.end_lr, self.warmup_prefix)


# ----------------------------------------------------------------------------------------------------------
# Defaults and checks


def epochs(given, training=True):
    """--num-epochs: as `given`, else the schedule's DEFAULT_EPOCHS for training, one pass for val, pred, export and
    --test-io."""
    if given is not None:
        return given
    return DEFAULT_EPOCHS if training else 1


def default_warmup(given, num_epochs, recipe=None, announce=True):
    """The run's warm-up: --warmup-epochs as `given` by the command; not given, DEFAULT_WARMUP_EPOCHS, or the
    warm-up of `recipe` (the --recipe that set `given`), shortened to half of a run shorter than twice that (with
    -e 3 a warm-up of 5 made every step warm-up: the rate peaked at 60% of --lr and never decayed, or it was
    refused), and said so when `announce` (a training run, not a --benchmark-iters measurement).
    rn50/config/resolve.py resolves --warmup-epochs with it."""
    if given is not None and recipe is None:
        return given
    planned = DEFAULT_WARMUP_EPOCHS if given is None else given
    warmup = min(planned, num_epochs / 2)
    if warmup < planned and announce:
        whose = f"--recipe {recipe}'s" if recipe else 'the default'
        log.info('--warmup-epochs not given: %g epochs of warm-up, half of the %d-epoch run (%s %g would leave '
                 'less than half of it to the decay)', warmup, num_epochs, whose, planned)
    return warmup


def check(steps, warmup_epochs, num_epochs, warmup_from_recipe=False):
    """RecipeError for a training schedule that cannot be what was meant, before anything starts (the flags need
    not be resolved: `num_epochs` None is the default length): --lr-steps out of order, or a --warmup-epochs the
    command gave longer than the run. The default warm-up and a --recipe's (`warmup_from_recipe`) are shortened
    to fit a shorter run instead (default_warmup)."""
    if any(later <= earlier for earlier, later in zip(steps, steps[1:])):
        raise RecipeError(f'--lr-steps {",".join(f"{step:g}" for step in steps)}: the epochs must increase, each '
                          f'once (e.g. {",".join(f"{step:g}" for step in sorted(set(steps)))})')
    length = epochs(num_epochs)
    if warmup_epochs is not None and warmup_epochs > length and not warmup_from_recipe:
        raise RecipeError(f'--warmup-epochs {warmup_epochs:g} is longer than the {length}-epoch schedule '
                          '(--num-epochs): the learning rate would never reach --lr; shorten the warmup or '
                          'lengthen the run')


# ----------------------------------------------------------------------------------------------------------
# Scaling a rate with the batch


def scaled_lr(rate, batch, reference, scaling):
    """The learning rate at `batch` images per optimizer step of a recipe whose rate is `rate` at `reference`
    images: `scaling` 'linear' multiplies it by the batch ratio (Goyal et al.; NVIDIA's, MLPerf's, torchvision's
    recipes), 'sqrt' by its square root (timm's lr_base_scale rule for adaptive optimizers, whose names contain
    'ada' or 'lamb': rsb-a3's 8e-3 at 2,048 images is 1e-3 at 32)."""
    if scaling == 'sqrt':
        return rate * math.sqrt(batch / reference)
    return rate * batch / reference


def scaling_words(rule):
    """The log's words for a scaling rule."""
    return {'linear': 'linearly with the batch',
            'sqrt': 'by the square root of the batch ratio (timm\'s rule for LAMB)'}[rule]
