"""What the loss sees: label-smoothed targets, mixup, CutMix, binary targets, and dynamic loss scaling for float16.

    targets = losses.smoothed_one_hot(labels, num_classes, 0.1)
    own, boxes = losses.mix_draws(seed, epoch, iteration, rank, part, batch, height, width,
                                  mixup=0.2, cutmix=1.0, switch_prob=0.5, mode='batch')   # or 'elem', 'pair'
    images, targets = losses.mix(images, targets, own, boxes, layout)
    scale = losses.DynamicLossScale()                              # --dtype float16 without AMP
    finite = scale.check(params)                                   # queued on the device
    if not scale.overflowed(finite): trainer.update(batch * scale.scale)   # the host reads it (GPUs: after the update)

step.TrainingStep uses them; they are pure functions of their inputs (mixup draws of the position in
training), so a resumed run computes what an uninterrupted one would. The flags of the targets are here too
(add_args: --label-smoothing, --mixup, --cutmix, --mixup-switch-prob, --mixup-mode, --bce-loss,
--bce-target-thresh), and the record the step takes of them (Targets).
"""
import dataclasses
import logging

import mxnet as mx
import numpy as np

from rn50 import flags
from rn50.errors import RecipeError

log = logging.getLogger(__name__)

# Below this loss scale every step has overflowed for a long time (16 halvings from 2**16): divergence.
LOSS_SCALE_FLOOR = 1.0


def add_args(group):
    """The targets' flags, in fit.py's Training group."""
    group.add_argument('--label-smoothing', type=flags.real(minimum=0, maximum=0.999), default=0.1,
                       help='label smoothing factor')
    group.add_argument('--mixup', type=flags.real(minimum=0), default=0,
                       help='alpha parameter for mixup (if 0 then mixup is not applied)')
    group.add_argument('--cutmix', type=flags.real(minimum=0), default=0,
                       help='alpha of CutMix (0: off): a box of another image of the batch pasted in, the targets '
                            'mixed by its area; with --mixup too, one of them per batch')
    group.add_argument('--mixup-switch-prob', type=flags.real(minimum=0, maximum=1), default=0.5,
                       help='with both --mixup and --cutmix, the probability that a draw (--mixup-mode) is CutMix')
    group.add_argument('--mixup-mode', default='elem', choices=MIXUP_MODES,
                       help='what shares one draw of --mixup and --cutmix (mixup or CutMix, its lambda or box), as '
                            'timm\'s --mixup-mode: elem (default), each image (the original recipe\'s mixup); pair, '
                            'images i and B-1-i, each mixed with the other; batch, each device\'s batch (timm\'s and '
                            'torchvision\'s recipes)')
    group.add_argument('--bce-loss', action='store_true',
                       help='binary cross-entropy on each class (timm\'s): sigmoid of each logit against the '
                            'targets of --label-smoothing, mixup and CutMix, averaged over the classes; validation '
                            'still reports the softmax cross-entropy')
    group.add_argument('--bce-target-thresh', type=flags.real(minimum=0, maximum=1), default=None,
                       help='--bce-loss: targets above this become 1, the others 0 (timm\'s; ResNet strikes back '
                            'uses 0.2)')


def check(bce_loss, bce_target_thresh):
    """RecipeError for target flags that cannot work together (--bce-loss, --bce-target-thresh)."""
    if bce_target_thresh is not None and not bce_loss:
        raise RecipeError('--bce-target-thresh sets the targets of --bce-loss: add --bce-loss')


@dataclasses.dataclass(frozen=True)
class Targets:
    """What the loss compares the network's outputs with, as values (`of`: the flags): `num_classes`, label
    `smoothing`, mixup's and CutMix's alphas (`mixup`, `cutmix`; 0: off), `switch_prob` and `mode` (--mixup-mode),
    binary cross-entropy (`bce`) and its `bce_threshold`, and the images' `layout` (where CutMix pastes)."""
    num_classes: int
    smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    switch_prob: float = 0.5
    mode: str = 'elem'
    bce: bool = False
    bce_threshold: float = None
    layout: str = 'NCHW'

    # The flags a resumed run must keep as its state recorded them (through StepSettings.RESUMED); the classes are
    # the network's (Network.RESUMED), the layout changes no number.
    RESUMED = ('label_smoothing', 'mixup', 'cutmix', 'mixup_switch_prob', 'mixup_mode', 'bce_loss',
               'bce_target_thresh')

    @classmethod
    def of(cls, args):
        return cls(num_classes=args.num_classes, smoothing=args.label_smoothing, mixup=args.mixup,
                   cutmix=args.cutmix, switch_prob=args.mixup_switch_prob, mode=args.mixup_mode, bce=args.bce_loss,
                   bce_threshold=args.bce_target_thresh, layout=args.input_layout)

    @property
    def sparse(self):
        """Whether the loss takes the labels as they are (no smoothing, no mixing, softmax cross-entropy)."""
        return self.smoothing == 0 and self.mixup == 0 and self.cutmix == 0 and not self.bce


def smoothed_one_hot(labels, num_classes, smoothing):
    """Dense targets: 1 - smoothing + smoothing/K for the label, smoothing/K elsewhere."""
    off = smoothing / num_classes
    return mx.nd.one_hot(labels, num_classes, on_value=1 - smoothing + off, off_value=off)


def bce_targets(targets, threshold):
    """--bce-target-thresh: dense targets above `threshold` become 1, the others 0 (timm's BinaryCrossEntropy);
    None leaves them as they are."""
    return targets if threshold is None else (targets > threshold).astype(targets.dtype)


# --mixup-mode: whose draws the images of a device's batch share. elem: every image its own (the original
# recipe's mixup, one lambda per image); pair: images i and B-1-i share theirs and each is mixed with the other;
# batch: one for the whole batch (timm's default, and torchvision's RandomMixup/RandomCutmix).
MIXUP_MODES = ('elem', 'pair', 'batch')


def mixup(images, targets, lam):
    """Per-sample mixup: sample i is blended with sample B-1-i with weight lam[i] (an NDArray of shape (B,))."""
    lam_images = lam.reshape((-1,) + (1,) * (images.ndim - 1)).astype(images.dtype)
    mixed_images = lam_images * images + (1 - lam_images) * images[::-1]
    lam_targets = lam.reshape((-1, 1))
    mixed_targets = lam_targets * targets + (1 - lam_targets) * targets[::-1]
    return mixed_images, mixed_targets


def mixup_weights(seed, epoch, iteration, rank, part, size, alpha):
    """`size` Beta(alpha, alpha) draws for one device's batch, a function of where in training we are, so a
    resumed run draws exactly what an uninterrupted one would."""
    rng = np.random.default_rng([seed, epoch, iteration, rank, part])
    return rng.beta(alpha, alpha, size=size).astype(np.float32)


def cutmix_uses(seed, epoch, iteration, rank, part, switch_prob, size=None):
    """With both --mixup and --cutmix, whether a draw gets CutMix (probability `switch_prob`, timm's
    --mixup-switch-prob) rather than mixup: one bool, or `size` of them; from the position in training."""
    return np.random.default_rng([seed, epoch, iteration, rank, part, 1]).random(size) < switch_prob


def cutmix_boxes(seed, epoch, iteration, rank, part, count, height, width, alpha):
    """`count` CutMix boxes: lam ~ Beta(alpha, alpha), a box of sides sqrt(1 - lam) times the image's centred on
    a uniform pixel, clipped to the image. Returns (boxes, kept): boxes (count, 4) of (top, bottom, left,
    right), kept (count,) = 1 - the clipped box's area / the image's, the weight of the image's own target."""
    rng = np.random.default_rng([seed, epoch, iteration, rank, part, 2])
    lam = rng.beta(alpha, alpha, size=count)
    cut = np.sqrt(1.0 - lam)
    box_h, box_w = (height * cut).astype(int), (width * cut).astype(int)
    centre_y, centre_x = rng.integers(0, height, size=count), rng.integers(0, width, size=count)
    top, bottom = np.clip(centre_y - box_h // 2, 0, height), np.clip(centre_y + box_h // 2, 0, height)
    left, right = np.clip(centre_x - box_w // 2, 0, width), np.clip(centre_x + box_w // 2, 0, width)
    kept = 1.0 - (bottom - top) * (right - left) / (height * width)
    return np.stack([top, bottom, left, right], axis=1), kept.astype(np.float32)


def mix_draws(seed, epoch, iteration, rank, part, size, height, width, mixup, cutmix, switch_prob, mode='elem'):
    """What mixup and CutMix do to one device's batch of `size` images of height x width, as timm's Mixup with
    --mixup-mode `mode` (MIXUP_MODES): each draw picks CutMix with probability `switch_prob` when both alphas
    are on (else the one that is), then its lambda (Beta(mixup, mixup)) or its box (cutmix_boxes). Returns
    (own, boxes): own (size,) float32, the weight of image i's own target (mixup: lambda; CutMix: the share of
    the image not pasted over); boxes (size, 4), image i's CutMix box (top, bottom, left, right), empty for
    mixup. Every draw is a function of the position in training, so a resume draws the same."""
    if mode not in MIXUP_MODES:
        raise ValueError(f'mode must be one of {MIXUP_MODES}, not {mode!r}')
    position = (seed, epoch, iteration, rank, part)
    draws = {'elem': size, 'pair': (size + 1) // 2, 'batch': 1}[mode]
    own, boxes = np.ones(draws, np.float32), np.zeros((draws, 4), np.int64)
    if mixup > 0:
        own[:] = mixup_weights(*position, draws, mixup)
    if cutmix > 0:
        cut = cutmix_uses(*position, switch_prob, draws) if mixup > 0 else np.ones(draws, bool)
        cut_boxes, kept = cutmix_boxes(*position, draws, height, width, cutmix)
        own[cut], boxes[cut] = kept[cut], cut_boxes[cut]
    image = np.arange(size)
    index = {'elem': image, 'pair': np.minimum(image, size - 1 - image), 'batch': np.zeros(size, np.int64)}[mode]
    return own[index], boxes[index]


def mix(images, targets, own, boxes, layout='NCHW'):
    """Image i blended with image B-1-i as mix_draws says: weight own[i] (mixup) or the pixels of boxes[i] pasted
    from image B-1-i (CutMix, copied exactly); the targets mixed by own[i]."""
    context, batch = images.context, images.shape[0]
    weights = mx.nd.array(own, ctx=context)
    pasted = (boxes[:, 1] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 2])
    if not pasted.any():      # mixup only: one weight per image
        return mixup(images, targets, weights)
    mixed_targets = weights.reshape((-1, 1)) * targets + (1 - weights.reshape((-1, 1))) * targets[::-1]
    height_axis = layout.index('H')
    height, width = images.shape[height_axis:height_axis + 2]

    def column(values):
        return mx.nd.array(values, ctx=context).reshape((batch, 1, 1))
    rows = mx.nd.arange(height, ctx=context).reshape((1, height, 1))
    cols = mx.nd.arange(width, ctx=context).reshape((1, 1, width))
    inside = mx.nd.broadcast_mul(
        mx.nd.broadcast_greater_equal(rows, column(boxes[:, 0])) * mx.nd.broadcast_lesser(rows, column(boxes[:, 1])),
        mx.nd.broadcast_greater_equal(cols, column(boxes[:, 2])) * mx.nd.broadcast_lesser(cols, column(boxes[:, 3])))
    # A pixel's weight of its own image: 1 - inside for a pasted image, own[i] everywhere for a mixed one.
    weight = mx.nd.broadcast_add(column(np.where(pasted, 0.0, own)),
                                 mx.nd.broadcast_mul(column(pasted.astype(np.float32)), 1 - inside))
    shape = [batch, 1, 1, 1]
    shape[height_axis:height_axis + 2] = height, width
    weight = weight.reshape(shape).astype(images.dtype)
    mixed_images = mx.nd.broadcast_mul(images, weight) + mx.nd.broadcast_mul(images[::-1], 1 - weight)
    return mixed_images, mixed_targets


def finite_flag(arrays):
    """An NDArray (1,) on the device of `arrays` (all on one device), not read: 1 when every value of every
    array is finite, else 0. multi_all_finite reads all its inputs as the first one's type, so float16 and
    float32 arrays are checked in separate calls (of at most 200 arrays)."""
    groups = {}
    for array in arrays:
        groups.setdefault(array.dtype, []).append(array)
    finite = mx.nd.ones((1,), ctx=arrays[0].context)
    for group in groups.values():
        for i in range(0, len(group), 200):
            chunk = group[i:i + 200]
            mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=False, out=finite)
    return finite


class DynamicLossScale:
    """Loss scaling for --dtype float16 without AMP: multiply the loss so small float16 gradients survive,
    skip the step and halve the scale when a gradient overflows, double it after `interval` clean steps.
    A scale below `floor` means every step overflows (a NaN loss does): the run has diverged."""

    def __init__(self, scale=2.0 ** 16, interval=2000, floor=1.0):
        self.scale = scale
        self.interval = interval
        self.floor = floor
        self.clean_steps = 0
        self.skipped = 0

    def check(self, params):
        """Queue the check of the (already all-reduced) gradients on the device; returns its flag (1: every
        gradient finite), not read yet, for `overflowed`.

        After the all-reduce every device of every worker holds the same gradient sums, so one copy per
        parameter is checked, on the first device; multi_all_finite reads all its inputs as the first one's
        type, so float16 (convolution, dense) and float32 (batchnorm) gradients are checked in separate calls."""
        return finite_flag([param.list_grad()[0] for param in params if param.grad_req != 'null'])

    def overflowed(self, finite):
        """Read the flag of `check` and update the scale; True means skip this step (on the CPU the update is
        not made; on GPUs it was queued already and is undone: step.UpdateUndo). The host waits for the device
        here, once per step."""
        if finite.asscalar() == 0:
            self.scale /= 2
            self.clean_steps = 0
            self.skipped += 1
            log.info('float16 gradient overflow: step skipped, loss scale lowered to %g', self.scale)
            return True
        self.clean_steps += 1
        if self.clean_steps == self.interval:
            self.scale *= 2
            self.clean_steps = 0
        return False

    def state(self):
        return {'scale': self.scale, 'clean_steps': self.clean_steps, 'skipped': self.skipped}

    def restore(self, state):
        self.scale, self.clean_steps, self.skipped = state['scale'], state['clean_steps'], state['skipped']
