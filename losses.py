"""What the loss sees: label-smoothed targets, mixup, CutMix, binary targets, and dynamic loss scaling for float16.

    targets = losses.smoothed_one_hot(labels, num_classes, 0.1)
    images, targets = losses.mixup(images, targets, lam)          # lam from losses.mixup_weights(...)
    box = losses.cutmix_box(seed, epoch, iteration, rank, part, height, width, alpha)
    images, targets = losses.cutmix(images, targets, box, layout)  # or losses.blend(...): one per batch
    scale = losses.DynamicLossScale()                              # --dtype float16 without AMP
    finite = scale.check(params)                                   # queued on the device
    if not scale.overflowed(finite): trainer.update(batch * scale.scale)   # the host reads it

step.TrainingStep uses them; they are pure functions of their inputs (mixup draws of the position in
training), so a resumed run computes what an uninterrupted one would.
"""
import logging

import mxnet as mx
import numpy as np

log = logging.getLogger(__name__)

# Below this loss scale every step has overflowed for a long time (16 halvings from 2**16): divergence.
LOSS_SCALE_FLOOR = 1.0


def smoothed_one_hot(labels, num_classes, smoothing):
    """Dense targets: 1 - smoothing + smoothing/K for the label, smoothing/K elsewhere."""
    off = smoothing / num_classes
    return mx.nd.one_hot(labels, num_classes, on_value=1 - smoothing + off, off_value=off)


def bce_targets(targets, threshold):
    """--bce-target-thresh: dense targets above `threshold` become 1, the others 0 (timm's BinaryCrossEntropy);
    None leaves them as they are."""
    return targets if threshold is None else (targets > threshold).astype(targets.dtype)


def mixup(images, targets, lam):
    """Per-sample mixup: sample i is blended with sample B-1-i with weight lam[i] (an NDArray of shape (B,))."""
    lam_images = lam.reshape((-1,) + (1,) * (images.ndim - 1)).astype(images.dtype)
    mixed_images = lam_images * images + (1 - lam_images) * images[::-1]
    lam_targets = lam.reshape((-1, 1))
    mixed_targets = lam_targets * targets + (1 - lam_targets) * targets[::-1]
    return mixed_images, mixed_targets


def mixup_weights(seed, epoch, iteration, rank, part, size, alpha):
    """The Beta(alpha, alpha) draws of one device's batch, a function of where in training we are, so a
    resumed run draws exactly what an uninterrupted one would."""
    rng = np.random.default_rng([seed, epoch, iteration, rank, part])
    return rng.beta(alpha, alpha, size=size).astype(np.float32)


def cutmix_uses(seed, epoch, iteration, rank, part, switch_prob):
    """With both --mixup and --cutmix, whether this device's batch gets CutMix (probability `switch_prob`,
    timm's --mixup-switch-prob) rather than mixup; drawn from the position in training like the rest."""
    return np.random.default_rng([seed, epoch, iteration, rank, part, 1]).random() < switch_prob


def cutmix_box(seed, epoch, iteration, rank, part, height, width, alpha):
    """One CutMix box for a device's batch: lam ~ Beta(alpha, alpha), a box of sides sqrt(1 - lam) times the
    image's centred on a uniform pixel, clipped to the image. Returns (top, bottom, left, right, kept), where
    `kept` = 1 - the clipped box's area / the image's is the weight of the image's own target."""
    rng = np.random.default_rng([seed, epoch, iteration, rank, part, 2])
    lam = rng.beta(alpha, alpha)
    cut = np.sqrt(1.0 - lam)
    box_h, box_w = int(height * cut), int(width * cut)
    centre_y, centre_x = rng.integers(0, height), rng.integers(0, width)
    top, bottom = np.clip([centre_y - box_h // 2, centre_y + box_h // 2], 0, height)
    left, right = np.clip([centre_x - box_w // 2, centre_x + box_w // 2], 0, width)
    kept = 1.0 - (bottom - top) * (right - left) / (height * width)
    return int(top), int(bottom), int(left), int(right), float(kept)


def cutmix(images, targets, box, layout='NCHW'):
    """Paste the box of sample B-1-i into sample i (the pairing of mixup) and mix the targets by the area
    actually pasted (`box` from cutmix_box)."""
    top, bottom, left, right, kept = box
    height_axis = layout.index('H')
    mask = np.zeros((images.shape[height_axis], images.shape[height_axis + 1]), dtype=np.float32)
    mask[top:bottom, left:right] = 1
    shape = [1] * images.ndim
    shape[height_axis:height_axis + 2] = mask.shape
    pasted = mx.nd.array(mask.reshape(shape), ctx=images.context, dtype=images.dtype)
    mixed_images = mx.nd.broadcast_mul(images, 1 - pasted) + mx.nd.broadcast_mul(images[::-1], pasted)
    return mixed_images, kept * targets + (1 - kept) * targets[::-1]


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
        groups = {}
        for param in params:
            if param.grad_req != 'null':
                grad = param.list_grad()[0]
                groups.setdefault(grad.dtype, []).append(grad)
        finite = mx.nd.ones((1,), ctx=next(iter(groups.values()))[0].context)
        for group in groups.values():
            for i in range(0, len(group), 200):
                chunk = group[i:i + 200]
                mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=False, out=finite)
        return finite

    def overflowed(self, finite):
        """Read the flag of `check` and update the scale; True means skip this step. The host waits for the
        device here (one synchronisation per step): the update that follows depends on the answer, and
        deciding it one step later would apply an overflowed update (or skip a clean one)."""
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
