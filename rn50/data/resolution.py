"""Progressive resizing (FFCV's ResNet-50 configurations): the training resolution grows linearly over given
epochs, and the loaders and the network follow it; validation stays at the test resolution, after a resize
that keeps the original recipe's ratio at any test size (default_val_resize).

    python train.py --image-shape 3,192,192 --progressive-size 160 --progressive-epochs 65,76 \
        --val-image-shape 3,256,256 --data-val-resize 292 ...          # FFCV's rn50 88 epochs: 160 -> 192

The size of epoch e is a pure function of e (so a resume at any epoch trains at the size an uninterrupted run
would): --progressive-size up to --progressive-epochs' first epoch, --image-shape's from its second on, and
between them the linear interpolation rounded to a multiple of --progressive-step (FFCV: 32). The network
(global average pooling before the classifier) takes any size; MXNet plans its memory again at each new one.
The training preset (preset.py's TrainingPreset.training_shape) gives each epoch's size with size_at.
"""
import numpy as np

from rn50 import flags
from rn50.errors import RecipeError


def add_args(group):
    """The flags, in data.py's Data group."""
    group.add_argument('--progressive-size', type=flags.integer(minimum=1), default=None,
                       help='progressive resizing: the training size (square) of the first epochs, growing to '
                            '--image-shape\'s over --progressive-epochs (default: off)')
    group.add_argument('--progressive-epochs', type=flags.int_tuple, default=None, metavar='START,END',
                       help='--progressive-size: the epochs over which the size grows (default: 0 and the last)')
    group.add_argument('--progressive-step', type=flags.integer(minimum=1), default=32,
                       help='--progressive-size: sizes are multiples of this (FFCV: 32)')


def check(size, epochs, image_shape, backend, num_epochs):
    """RecipeError for a progressive resizing that cannot work: --progressive-size (`size`), --progressive-epochs
    (`epochs`), --image-shape, --data-backend (`backend`) and --num-epochs."""
    if size is None:
        if epochs is not None:
            raise RecipeError('--progressive-epochs says when --progressive-size grows: add --progressive-size')
        return
    height, width = image_shape[1:]
    if height != width:
        raise RecipeError(f'--progressive-size: the training images are square; --image-shape is {height}x{width}')
    if size > height:
        raise RecipeError(f'--progressive-size {size} is larger than --image-shape\'s {height}, '
                          'the size it grows to')
    if backend == 'synthetic':
        raise RecipeError('--progressive-size resizes decoded images; --data-backend synthetic has none')
    start, end = ramp(epochs, num_epochs)
    if not 0 <= start <= end:
        raise RecipeError(f'--progressive-epochs {start},{end}: expected 0 <= START <= END')


def ramp(epochs, num_epochs):
    """(first, last) epoch of the growth: --progressive-epochs (`epochs`), by default all the run's."""
    if epochs is None:
        return 0, max(num_epochs - 1, 0)
    if len(epochs) != 2:
        raise RecipeError('--progressive-epochs takes two epochs: START,END')
    return tuple(epochs)


def size_at(epoch, low, high, start, end, step):
    """The training size of `epoch` (a pure function): `low` until `start`, `high` from `end`, in between the
    linear interpolation rounded to a multiple of `step` (kept within [low, high])."""
    if epoch <= start:
        return low
    if epoch >= end:
        return high
    size = round(float(np.interp(epoch, [start, end], [low, high])) / step) * step
    return int(min(max(size, low), high))


# The original recipe validates at 224 after resizing the shorter side to 256: that ratio at any test size.
VAL_RESIZE_RATIO = 256 / 224


def default_val_resize(image_shape, val_image_shape=None):
    """--data-val-resize when neither the command nor a recipe gives it: the test size (--val-image-shape, else
    --image-shape) times 256/224, so that a run at 64 tests a 64 crop of a 73-pixel image, as one at 224 does of
    a 256-pixel one, instead of a 64-pixel patch of a 256-pixel image."""
    return round(max((val_image_shape or image_shape)[1:]) * VAL_RESIZE_RATIO)
