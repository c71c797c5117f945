"""The DALI backends' augmentations beyond the crop and flip, as torchvision's and timm's ImageNet recipes use
them: automatic augmentation (--auto-augment) and random erasing (--random-erase).

    ./runner -n 8 --auto-augment ta_wide --random-erase 0.1 ...
    python train.py --data-backend dali-cpu --auto-augment ra --ra-magnitude 9 --ra-num-ops 2 ...

The operations are DALI's own (nvidia.dali.auto_aug: the TrivialAugment-wide and RandAugment suites and
AutoAugment's ImageNet policy, applied by its `select`; fn.erase). What each image gets (operation, magnitude
bin, sign; the erased box and its noise) is drawn here in numpy from (--seed, epoch, rank, batch, device), as
dali.py draws the crop windows: DALI's own samplers draw from the pipeline's generator, which a resume at batch
k cannot put back where it was, so with them a resumed epoch would see other augmentations.

* ta_wide (torchvision's TrivialAugmentWide): one of 14 operations per image, uniformly, at a magnitude
  uniform over 31 bins, negated with probability 1/2 where the operation has a sign; translations up to 32
  pixels, as torchvision.
* ra (RandAugment): --ra-num-ops operations in turn, each uniform over the same 14 with narrower ranges, at
  bin --ra-magnitude of 31, random sign; translations up to 100/224 of the image (torchvision: 150/331).
* imagenet (AutoAugment's ImageNet policy): one of its 25 sub-policies uniformly; each of its two
  operations applied with its own probability at its own magnitude (11 bins), random sign.
* --random-erase P (torchvision's RandomErasing, timm's): with probability P a box of 2-33% of the image's
  area, aspect ratio log-uniform in 0.3-3.3 (10 tries to fit, else none), at a uniform position, set after
  normalisation to per-pixel standard normal noise (--random-erase-mode pixel, timm's) or to 0, the mean
  colour (const, torchvision's).
The native backend (ImageRecordIter) has none of these and refuses the flags. --aug-repeats N (repeated
augmentation) is a property of the epoch's order (records.epoch_order) and works with every backend that reads
records.
"""
import numpy as np

import flags
from errors import RecipeError

POLICIES = ('ta_wide', 'ra', 'imagenet')
ERASE_AREA = (0.02, 1 / 3)
ERASE_ASPECT = (0.3, 1 / 0.3)
ERASE_TRIES = 10
FILL = 128               # the colour uncovered by a rotation, shear or translation, as torchvision's default
AUTO_AUGMENT_STREAM = 0xa0a
ERASE_STREAM = 0xe7a5


def add_args(parser):
    group = parser.add_argument_group('Augmentation', 'automatic augmentation and random erasing (--data-backend '
                                      'dali-gpu or dali-cpu), repeated augmentation (any backend reading records)')
    group.add_argument('--auto-augment', choices=POLICIES,
                       help="automatic augmentation after the crop: ta_wide (TrivialAugment-wide), ra "
                            "(RandAugment), imagenet (AutoAugment's ImageNet policy)")
    group.add_argument('--ra-magnitude', type=flags.integer(minimum=0), default=9,
                       help='--auto-augment ra: the magnitude bin of every operation, of 31')
    group.add_argument('--ra-num-ops', type=flags.integer(minimum=1), default=2,
                       help='--auto-augment ra: operations per image')
    group.add_argument('--random-erase', type=flags.real(minimum=0, maximum=1), default=0.0,
                       help='probability of erasing a random box of each training image (0: off)')
    group.add_argument('--random-erase-mode', choices=('pixel', 'const'), default='const',
                       help='what fills an erased box: per-pixel normal noise (timm) or 0, the mean (torchvision)')
    group.add_argument('--aug-repeats', type=flags.integer(minimum=1), default=1,
                       help='repeated augmentation: each image of an epoch N times, its copies on different '
                            'workers, in an epoch as long as without (1/N of the images per epoch)')
    return group


def check(args):
    """RecipeError for these flags on a backend that does not have them, or out of range."""
    used = [flag for flag, on in (('--auto-augment', args.auto_augment), ('--random-erase', args.random_erase))
            if on]
    if used and args.data_backend not in ('dali-gpu', 'dali-cpu'):
        raise RecipeError(f'{" and ".join(used)}: only the DALI backends implement this (--data-backend dali-gpu, '
                          f'or dali-cpu without a GPU); --data-backend {args.data_backend} has no such augmentation')
    if args.aug_repeats > 1 and args.data_backend == 'synthetic':
        raise RecipeError('--aug-repeats repeats the records of an epoch; --data-backend synthetic has none')
    if args.auto_augment == 'ra' and args.ra_magnitude >= 31:
        raise RecipeError(f'--ra-magnitude {args.ra_magnitude}: the bins are 0 to 30')


class Policy:
    """One --auto-augment policy: `suite` (DALI augmentations), `stages` (operations applied in turn),
    `num_bins`, and draw(), which says per image and stage which operation, bin and sign."""

    def __init__(self, args):
        from nvidia.dali.auto_aug import augmentations, auto_augment, rand_augment, trivial_augment
        self.name, self.stages = args.auto_augment, 1
        if self.name == 'ta_wide':
            self.suite, self.num_bins = trivial_augment.get_trivial_augment_wide_suite(), 31
        elif self.name == 'ra':
            self.suite, self.num_bins = rand_augment.get_rand_augment_suite(use_shape=True), 31
            self.stages, self.magnitude = args.ra_num_ops, args.ra_magnitude
        else:
            policy = auto_augment.get_image_net_policy(use_shape=True)
            self.suite = list(policy.augmentations.values())
            if augmentations.identity not in self.suite:
                self.suite.append(augmentations.identity)     # what a stage that does not run applies
            self.num_bins, self.stages = policy.num_magnitude_bins, max(map(len, policy.sub_policies))
            # per sub-policy and stage: the operation's index in the suite, its probability and its bin
            self.sub_policies = np.array(
                [[(self.suite.index(aug), probability, magnitude or 0) for aug, probability, magnitude in sub]
                 + [(self.suite.index(augmentations.identity), 0.0, 0)] * (self.stages - len(sub))
                 for sub in policy.sub_policies], dtype=np.float64)
        self.identity = next(i for i, aug in enumerate(self.suite) if aug.name == 'identity')

    def draw(self, rng, count):
        """(operations, bins, signs): int32 arrays of (count, stages) for `count` images."""
        shape = (count, self.stages)
        if self.name == 'ta_wide':
            ops, bins = rng.integers(0, len(self.suite), shape), rng.integers(0, self.num_bins, shape)
        elif self.name == 'ra':
            ops, bins = rng.integers(0, len(self.suite), shape), np.full(shape, self.magnitude)
        else:
            chosen = self.sub_policies[rng.integers(0, len(self.sub_policies), count)]   # (count, stages, 3)
            runs = rng.uniform(size=shape) < chosen[:, :, 1]
            ops = np.where(runs, chosen[:, :, 0], self.identity)
            bins = chosen[:, :, 2]
        signs = rng.integers(0, 2, shape)
        return ops.astype(np.int32), bins.astype(np.int32), signs.astype(np.int32)

    def apply(self, images, ops, bins, signs, size):
        """The DALI graph: `images` (uint8 HWC of `size`, (height, width) or a DataNode of them) through the
        drawn operations of each stage. Needs a pipeline built with enable_conditionals (select splits the
        batch by operation)."""
        from nvidia.dali.auto_aug.core import select, signed_bin
        for stage in range(self.stages):
            images = select(self.suite, ops[stage], images, magnitude_bin=signed_bin(bins[stage], signs[stage]),
                            num_magnitude_bins=self.num_bins, fill_value=FILL, shape=size)
        return images


def erase_boxes(rng, count, height, width, probability):
    """(anchors, shapes): float32 (count, 2) arrays of (y, x) and (h, w) in pixels, by torchvision's
    RandomErasing rule; a (0, 0) shape for an image not erased (not drawn, or no try fitted)."""
    erased = rng.uniform(size=count) < probability
    area = rng.uniform(*ERASE_AREA, (count, ERASE_TRIES)) * height * width
    aspect = np.exp(rng.uniform(np.log(ERASE_ASPECT[0]), np.log(ERASE_ASPECT[1]), (count, ERASE_TRIES)))
    box_h, box_w = np.round(np.sqrt(area * aspect)), np.round(np.sqrt(area / aspect))
    fits = (box_h < height) & (box_w < width)
    first = fits.argmax(axis=1)
    rows = np.arange(count)
    keep = erased & fits[rows, first]
    box_h, box_w = np.where(keep, box_h[rows, first], 0), np.where(keep, box_w[rows, first], 0)
    position = rng.uniform(size=(count, 2))
    y, x = np.floor(position[:, 0] * (height - box_h + 1)), np.floor(position[:, 1] * (width - box_w + 1))
    return np.stack([y, x], 1).astype(np.float32), np.stack([box_h, box_w], 1).astype(np.float32)


def erase_noise(rng, shapes, channels):
    """Per image, --random-erase-mode pixel's fill of its box: float32 standard normal noise of the box's shape
    in the colour channels, 0 in a 4th (--image-shape 4,...) channel."""
    noise = []
    for h, w in shapes.astype(int):
        box = np.zeros((h, w, channels), np.float32)
        box[:, :, :3] = rng.standard_normal((h, w, 3), dtype=np.float32)
        noise.append(box)
    return noise


def apply_erase(images, anchors, shapes, noise, size):
    """The DALI graph: the boxes of normalised HWC `images` (of `size`, (height, width) or a DataNode of
    them) set to 0, plus, with `noise` (pixel mode), the noise placed in them."""
    from nvidia.dali import fn
    images = fn.erase(images, anchor=anchors, shape=shapes, axes=[0, 1], fill_value=0)
    if noise is None:
        return images
    canvas = np.array(size, np.float32) if isinstance(size, tuple) else size
    return images + fn.slice(noise, -anchors, canvas, axes=[0, 1],
                             out_of_bounds_policy='pad', fill_values=0, normalized_anchor=False,
                             normalized_shape=False)
