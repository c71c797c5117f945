"""The learning rate schedule: a pure function of the position in training (fit.py uses it per iteration), and
the schedule's length and warm-up when the flags do not give them (rn50/config/resolve.py resolves both).

    lr = schedule.learning_rate(epoch + iteration / iterations, base_lr=0.1, num_epochs=90, warmup_epochs=5)
"""
import logging
import math

log = logging.getLogger(__name__)

DEFAULT_EPOCHS = 90
DEFAULT_WARMUP_EPOCHS = 5


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


def default_warmup(args, from_recipe):
    """The run's warm-up: --warmup-epochs as given; not given, DEFAULT_WARMUP_EPOCHS or the --recipe's
    (`from_recipe`: the recipe set it), shortened to half of a run shorter than twice that (with -e 3 a warm-up
    of 5 made every step warm-up: the rate peaked at 60% of --lr and never decayed, or it was refused), and
    said so. rn50/config/resolve.py resolves --warmup-epochs with it."""
    if args.warmup_epochs is not None and not from_recipe:
        return args.warmup_epochs
    planned = DEFAULT_WARMUP_EPOCHS if args.warmup_epochs is None else args.warmup_epochs
    warmup = min(planned, args.num_epochs / 2)
    if warmup < planned and args.mode in ('train', 'train_val') and not args.benchmark_iters:
        whose = f"--recipe {args.recipe}'s" if from_recipe else 'the default'
        log.info('--warmup-epochs not given: %g epochs of warm-up, half of the %d-epoch run (%s %g would leave '
                 'less than half of it to the decay)', warmup, args.num_epochs, whose, planned)
    return warmup
