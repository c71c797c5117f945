"""The learning rate schedule: a pure function of the position in training (fit.py uses it per iteration).

    lr = schedule.learning_rate(epoch + iteration / iterations, base_lr=0.1, num_epochs=90, warmup_epochs=5)
"""
import math


def learning_rate(progress, base_lr, num_epochs, warmup_epochs=0, schedule='cosine', steps=(), factor=0.1,
                  power=2.0, end_lr=0.0001):
    """The learning rate at `progress` = epoch + iteration / iterations_per_epoch (a pure function).

    Linear warmup from 0 over `warmup_epochs`, then either
    - cosine: half a cosine from base_lr to 0 at num_epochs; with `steps`, the span is cut into segments at
      those epochs and each segment k restarts the cosine from base_lr * factor**k;
    - multistep: base_lr * factor**(number of steps <= progress);
    - poly (MLPerf's): end_lr + (base_lr - end_lr) * (1 - (progress - warmup) / (num_epochs - warmup))**power,
      from base_lr after the warmup to end_lr at num_epochs.
    """
    if progress >= num_epochs:
        return end_lr if schedule == 'poly' else 0.0
    decays = sum(1 for s in steps if s <= progress)
    if progress < warmup_epochs:
        scale = factor ** decays if schedule == 'multistep' else 1.0
        return base_lr * scale * progress / warmup_epochs
    if schedule == 'multistep':
        return base_lr * factor ** decays
    if schedule == 'poly':
        remaining = 1 - (progress - warmup_epochs) / (num_epochs - warmup_epochs)
        return end_lr + (base_lr - end_lr) * remaining ** power
    bounds = [warmup_epochs] + [s for s in steps if warmup_epochs < s < num_epochs] + [num_epochs]
    segment = max(k for k in range(len(bounds) - 1) if bounds[k] <= progress)
    start, end = bounds[segment], bounds[segment + 1]
    return base_lr * factor ** segment * 0.5 * (1 + math.cos(math.pi * (progress - start) / (end - start)))
