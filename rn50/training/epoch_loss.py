"""The training loss of an epoch, as fit.py's epoch loop keeps it:

    epoch_loss = EpochLoss(progress, last_state)   # the run's checkpoints.saver.Progress (its loss sums)
    epoch_loss.add(loss, epoch, iteration, step)   # each iteration's loss (on a GPU one iteration late)
    epoch_loss.window_mean()                       # the --disp-batches window's mean, for the progress line

A non-finite loss stops training with one error (unless the step skips such steps, as float16 loss scaling does).
"""
import math

from rn50.errors import RecipeError


class EpochLoss:
    """The sum and count of the finite iteration losses of an epoch (in the run's Progress, which its states
    record, so a resumed epoch reports the loss over all its iterations), and of the current --disp-batches
    window. `last_state`: the path of the run's last state, which a non-finite loss's error names."""

    def __init__(self, progress, last_state):
        self.progress, self.last_state = progress, last_state
        self.window_sum, self.window_count = 0.0, 0

    def add(self, value, epoch, iteration, step):
        if not math.isfinite(value) and not step.skips_bad_steps:
            raise RecipeError(f'the training loss became {value} at epoch {epoch} iteration {iteration}: '
                              f'training stopped. The last good state is {self.last_state} '
                              '(if it exists); lower --lr, add --warmup-epochs, or check the data')
        if math.isfinite(value):
            self.progress.loss_sum += value
            self.progress.loss_count += 1
            self.window_sum += value
            self.window_count += 1

    def window_mean(self):
        """The mean over the window, which then starts again."""
        mean = self.window_sum / max(self.window_count, 1)
        self.window_sum, self.window_count = 0.0, 0
        return mean
