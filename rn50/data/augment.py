"""The DALI backends' augmentations beyond the crop and flip, as torchvision's and timm's ImageNet recipes use
them: automatic augmentation (--auto-augment) and random erasing (--random-erase).

    ./runner -n 8 --auto-augment ta_wide --random-erase 0.1 ...
    python train.py --data-backend dali-cpu --auto-augment ra --ra-magnitude 9 --ra-num-ops 2 ...
    python train.py ... --auto-augment ra --ra-ops timm-increasing --ra-magnitude 6 --ra-magnitude-scale 10 \\
        --ra-magnitude-std 0.5 --ra-prob 0.5 --auto-augment-fill 124,116,104     # timm's rand-m6-mstd0.5-inc1

The operations are DALI's own (nvidia.dali.auto_aug: the TrivialAugment-wide and RandAugment suites and
AutoAugment's ImageNet policy, applied by its `select`; fn.erase). What each image gets (operation, magnitude
bin, sign; the erased box and its noise) is drawn here in numpy from (--seed, epoch, rank, batch, device), as
crop_windows.py draws the crop windows: DALI's own samplers draw from the pipeline's generator, which a resume at batch
k cannot put back where it was, so with them a resumed epoch would see other augmentations.

* ta_wide (torchvision's TrivialAugmentWide): one of 14 operations per image, uniformly, at a magnitude
  uniform over 31 bins, negated with probability 1/2 where the operation has a sign; translations up to 32
  pixels, as torchvision.
* ra (RandAugment): --ra-num-ops operations in turn, each drawn uniformly (with replacement) from --ra-ops
  and applied with probability --ra-prob, at magnitude --ra-magnitude of --ra-magnitude-scale (the fraction
  of the operation's range) plus, per application, normal noise of standard deviation --ra-magnitude-std,
  clipped to [0, scale]; random sign. Defaults are torchvision's RandAugment (scale 30 = its 31 bins, no
  noise, always applied). With noise (or a fractional magnitude) the drawn magnitude is kept to 1/100 of a
  unit (RA_STEPS_PER_UNIT), fine enough that timm's noise (0.5) is not rounded away; without it the bins are
  whole units (torchvision's 31). DALI computes the parameters of every bin of every operation as it builds a
  pipeline; with the operations outside AutoGraph (apply) 3,001 bins take 0.5 s of CPU, not 32 to 35 s.
  --ra-ops torchvision: DALI's RandAugment suite, torchvision's
  14 operations (translations up to 100/224 of the image, torchvision: 150/331); timm-increasing: timm's
  increasing set (its `inc1`: no identity; invert, solarize-add, posterize from 4 to 0 bits, translations up
  to 45%), from DALI's operations.
* imagenet (AutoAugment's ImageNet policy): one of its 25 sub-policies uniformly; each of its two
  operations applied with its own probability at its own magnitude (11 bins), random sign.
* --auto-augment-fill: the colour of the pixels a rotation, shear or translation uncovers: 0 (torchvision's
  fill=None), one value, R,G,B (timm fills its mean colour, 124,116,104), or `mean` (--rgb-mean rounded).
  DALI's warps take one fill value for all channels, so a colour of unequal channels is warped as (image -
  colour) filled with 0, plus the colour: the same interpolation as a per-channel fill.
* --random-erase P (torchvision's RandomErasing, timm's): with probability P a box of 2-33% of the image's
  area, aspect ratio log-uniform in 0.3-3.3 (10 tries to fit, else none), at a uniform position, set after
  normalisation to per-pixel standard normal noise (--random-erase-mode pixel, timm's) or to 0, the mean
  colour (const, torchvision's). Erasing always runs in float32 (dali.py), the batch cast to float16 after
  it when the network takes float16: DALI's GPU erase has no float16 (dali/operators/generic/erase/
  erase.cu lists the integer types and float), nor its arithmetic (the noise is added in float32).
The native backend (ImageRecordIter) has none of these and refuses the flags. --aug-repeats N (repeated
augmentation) is a property of the epoch's order (records.epoch_order) and works with every backend that reads
records.

--auto-augment needs DALI 1.24 or newer (nvidia.dali.auto_aug came in 1.24, pipelines with conditionals in
1.23; the recipe is tested with DALI_TESTED): check() says so in one error before anything is built. Without
--auto-augment no pipeline asks for conditionals, so an older DALI still runs everything else.
"""
import argparse
import functools

import numpy as np

from rn50 import flags
from rn50.errors import RecipeError

POLICIES = ('ta_wide', 'ra', 'imagenet')
RA_OPS = ('torchvision', 'timm-increasing')
RA_STEPS_PER_UNIT = 100      # magnitude bins per unit of --ra-magnitude
ERASE_AREA = (0.02, 1 / 3)
ERASE_ASPECT = (0.3, 1 / 0.3)
ERASE_TRIES = 10
AUTO_AUGMENT_STREAM = 0xa0a
ERASE_STREAM = 0xe7a5
DALI_NEEDED = '1.24'
DALI_TESTED = '1.34.0'       # requirements.txt and the Dockerfile


def fill_colour(text):
    """--auto-augment-fill: 'mean', one value (every channel) or R,G,B, each from 0 to 255."""
    if text.strip().lower() == 'mean':
        return 'mean'
    values = tuple(flags.real(minimum=0, maximum=255)(item) for item in text.split(','))
    if len(values) not in (1, 3):
        raise argparse.ArgumentTypeError(f'{text!r}: expected one value, R,G,B (each 0 to 255) or mean')
    return values[0] if len(values) == 1 else values


def add_args(parser):
    group = parser.add_argument_group('Augmentation', 'automatic augmentation and random erasing (--data-backend '
                                      'dali-gpu or dali-cpu), repeated augmentation (any backend reading records)')
    group.add_argument('--auto-augment', choices=POLICIES,
                       help="automatic augmentation after the crop: ta_wide (TrivialAugment-wide), ra "
                            "(RandAugment), imagenet (AutoAugment's ImageNet policy); needs DALI 1.24 or newer")
    group.add_argument('--auto-augment-fill', type=fill_colour, default=0.0,
                       help='--auto-augment: the colour of the pixels a rotation, shear or translation uncovers: one '
                            'value, R,G,B (0-255), or mean (--rgb-mean rounded); default 0, torchvision\'s (timm: '
                            'its mean colour, 124,116,104)')
    group.add_argument('--ra-magnitude', type=flags.real(minimum=0), default=9,
                       help='--auto-augment ra: the magnitude of every operation, from 0 to --ra-magnitude-scale')
    group.add_argument('--ra-magnitude-scale', type=flags.integer(minimum=1), default=30,
                       help="--auto-augment ra: the magnitude of an operation's whole range (torchvision: 30, its 31 "
                            "bins; timm: 10)")
    group.add_argument('--ra-magnitude-std', type=flags.real(minimum=0), default=0.0,
                       help='--auto-augment ra: standard deviation of the normal noise added to the magnitude at each '
                            "application, the sum clipped to [0, --ra-magnitude-scale] (timm's mstd); default 0, none "
                            "(torchvision)")
    group.add_argument('--ra-prob', type=flags.real(minimum=0, maximum=1), default=1.0,
                       help='--auto-augment ra: probability of applying each drawn operation (torchvision: 1; timm: '
                            '0.5)')
    group.add_argument('--ra-num-ops', type=flags.integer(minimum=1), default=2,
                       help='--auto-augment ra: operations per image')
    group.add_argument('--ra-ops', choices=RA_OPS, default='torchvision',
                       help="--auto-augment ra: the operations: torchvision's 14 (DALI's RandAugment suite) or timm's "
                            "increasing set (inc1)")
    group.add_argument('--random-erase', type=flags.real(minimum=0, maximum=1), default=0.0,
                       help='probability of erasing a random box of each training image (0: off)')
    group.add_argument('--random-erase-mode', choices=('pixel', 'const'), default='const',
                       help='what fills an erased box: per-pixel normal noise (timm) or 0, the mean (torchvision)')
    group.add_argument('--aug-repeats', type=flags.integer(minimum=1), default=1,
                       help='repeated augmentation: each image of an epoch N times, its copies on different '
                            'workers, in an epoch as long as without (1/N of the images per epoch)')
    return group


# The flags of --auto-augment ra alone (a recipe may set them for another policy's run; a user who gives one
# without ra is told).
RA_FLAGS = ('ra_magnitude', 'ra_magnitude_scale', 'ra_magnitude_std', 'ra_prob', 'ra_num_ops', 'ra_ops')


def check(preset, backend, given, training=True, local=True):
    """RecipeError for these flags (as `preset`, the TrainingPreset, holds them) on a --data-backend (`backend`)
    that does not have them, out of range, given where they would be ignored (`given`: the destinations of the
    flags the command named), or --auto-augment on a DALI without automatic augmentation (the installed one, for
    a `training` run; `local` False: the workers run elsewhere and check theirs)."""
    auto = preset.auto_augment
    policy = auto.policy if auto else None
    used = [flag for flag, on in (('--auto-augment', policy), ('--random-erase', preset.random_erase)) if on]
    if used and backend not in ('dali-gpu', 'dali-cpu'):
        raise RecipeError(f'{" and ".join(used)}: only the DALI backends implement this (--data-backend dali-gpu, '
                          f'or dali-cpu without a GPU); --data-backend {backend} has no such augmentation')
    if preset.repeats > 1 and backend == 'synthetic':
        raise RecipeError('--aug-repeats repeats the records of an epoch; --data-backend synthetic has none')
    idle = [name for name in RA_FLAGS if name in given] if policy != 'ra' else []
    idle += ['auto_augment_fill'] if 'auto_augment_fill' in given and not policy else []
    if idle:
        names = ', '.join('--' + name.replace('_', '-') for name in idle)
        raise RecipeError(f'{names} would be ignored: {"they shape" if len(idle) > 1 else "it shapes"} '
                          f'{"--auto-augment ra" if idle[0].startswith("ra_") else "--auto-augment"}, which this '
                          f'run does not use (--auto-augment {policy or "not given"})')
    if policy == 'ra' and auto.ra_magnitude > auto.ra_magnitude_scale:
        raise RecipeError(f'--ra-magnitude {auto.ra_magnitude} is above --ra-magnitude-scale '
                          f'{auto.ra_magnitude_scale}, the whole range of an operation')
    if policy and training and local:
        check_dali()


def check_dali():
    """RecipeError unless the installed DALI has what --auto-augment uses: the nvidia.dali.auto_aug module and
    pipeline_def's enable_conditionals."""
    import importlib
    import inspect
    try:
        dali = importlib.import_module('nvidia.dali')
    except ImportError:
        dali = None
    version = getattr(dali, '__version__', None)
    lacks = []
    if dali is not None:
        try:
            importlib.import_module('nvidia.dali.auto_aug')
        except ImportError:
            lacks.append('nvidia.dali.auto_aug')
        if 'enable_conditionals' not in inspect.signature(dali.pipeline_def).parameters:
            lacks.append("pipeline_def's enable_conditionals")
    if dali is None or lacks:
        found = f'DALI {version or "(version unknown)"} lacks {" and ".join(lacks)}' if dali else \
            'DALI is not installed'
        raise RecipeError(f'--auto-augment needs DALI {DALI_NEEDED} or newer (automatic augmentation, conditional '
                          f'pipelines) and {found}: pip install nvidia-dali-cuda110=={DALI_TESTED}, the version '
                          'the recipe is tested with (requirements.txt; the Dockerfile installs it)')


def colour_filled(aug, colour):
    """DALI's augmentation `aug` (a warp whose op takes one fill_value) filling with a per-channel `colour`:
    the image less the colour is warped with fill 0 (in float32), and the colour added back; so a pixel that
    interpolates between the image and the outside gets the colour's share, as with a per-channel fill."""
    from nvidia.dali import fn, types
    from nvidia.dali.auto_aug.core import augmentation
    warp = aug.op

    @functools.wraps(warp)     # the same signature: DALI passes an op the keywords it declares
    def op(data, parameter, **kwargs):
        shift = types.Constant(np.array(colour, np.float32))
        warped = warp(data - shift, parameter, **dict(kwargs, fill_value=0))
        return fn.cast(warped + shift, dtype=types.UINT8)
    return augmentation(op, mag_range=aug.mag_range, randomly_negate=aug.randomly_negate,
                        mag_to_param=aug.mag_to_param, param_device=aug.param_device, name=aug.name)


def timm_posterize_mask(magnitude):
    """The bit mask of timm's PosterizeIncreasing at `magnitude` (0 to 4 over the range): keep 4 - floor(m)
    bits, none at the top (a black image; DALI's own posterize keeps at least one)."""
    kept = 4 - int(np.floor(magnitude + 1e-4))
    return np.array(0xff ^ (2 ** (8 - kept) - 1), dtype=np.uint8)


def ra_suite(ops):
    """(operations, how many of them are drawn) of --ra-ops; the last is the identity, what an operation not
    applied (--ra-prob) does."""
    from nvidia.dali.auto_aug import augmentations as dali_ops, rand_augment
    if ops == 'torchvision':
        suite = rand_augment.get_rand_augment_suite(use_shape=True)     # its identity is one of the 14
        return suite, len(suite)
    dali = {aug.name: aug for aug in rand_augment.get_rand_augment_suite(use_shape=True, max_translate_rel=0.45)}
    suite = [dali['auto_contrast'], dali['equalize'], dali_ops.invert, dali['rotate'],
             dali_ops.posterize.augmentation(mag_range=(0, 4), mag_to_param=timm_posterize_mask),
             dali['solarize'], dali_ops.solarize_add, dali['color'], dali['contrast'], dali['brightness'],
             dali['sharpness'], dali['shear_x'], dali['shear_y'], dali['translate_x'], dali['translate_y']]
    return suite + [dali['identity']], len(suite)


class AutoAugmentPolicy:
    """One --auto-augment policy (`auto`, the training preset's AutoAugment): `suite` (DALI augmentations),
    `stages` (operations applied in turn), `num_bins`, and draw(), which says per image and stage which operation,
    bin and sign."""

    def __init__(self, auto):
        from nvidia.dali.auto_aug import augmentations, auto_augment, trivial_augment
        self.name, self.stages = auto.policy, 1
        if self.name == 'ta_wide':
            self.suite, self.num_bins = trivial_augment.get_trivial_augment_wide_suite(), 31
        elif self.name == 'ra':
            self.suite, self.choices = ra_suite(auto.ra_ops)
            self.stages, self.scale = auto.ra_num_ops, auto.ra_magnitude_scale
            self.magnitude, self.std, self.prob = auto.ra_magnitude, auto.ra_magnitude_std, auto.ra_prob
            whole_units = self.std == 0 and float(self.magnitude).is_integer()
            self.steps_per_unit = 1 if whole_units else RA_STEPS_PER_UNIT
            self.num_bins = self.scale * self.steps_per_unit + 1
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
        self.fill = auto.fill
        if isinstance(self.fill, tuple):
            import inspect
            self.suite = [colour_filled(aug, self.fill) if 'fill_value' in inspect.signature(aug.op).parameters
                          else aug for aug in self.suite]

    def draw(self, rng, count):
        """(operations, bins, signs): int32 arrays of (count, stages) for `count` images."""
        shape = (count, self.stages)
        if self.name == 'ta_wide':
            ops, bins = rng.integers(0, len(self.suite), shape), rng.integers(0, self.num_bins, shape)
        elif self.name == 'ra':
            ops = rng.integers(0, self.choices, shape)
            if self.prob < 1:
                ops = np.where(rng.uniform(size=shape) < self.prob, ops, self.identity)
            magnitude = np.full(shape, float(self.magnitude))
            if self.std > 0:
                magnitude += self.std * rng.standard_normal(shape)
            bins = np.rint(np.clip(magnitude, 0, self.scale) * self.steps_per_unit)
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
        from nvidia.dali._autograph import do_not_convert
        from nvidia.dali.auto_aug.core import select, signed_bin
        fill = 0 if isinstance(self.fill, tuple) else self.fill     # colour_filled warps fill by themselves
        # The operations run as plain Python in select's branches. AutoGraph, which the pipeline's conditionals
        # need for select's own `if` on the drawn index, would otherwise convert every call they make, above all
        # the parameters of each magnitude bin and sign: 11 to 12.5 s of CPU to build an rsb-a3 pipeline (1,001 bins,
        # 15 operations, 2 stages), 0.22 s so, the same batches (tests/test_augment.py). DALI's operators split their
        # inputs by the branch themselves, and no operation branches on a DataNode. do_not_convert is AutoGraph's
        # own (tf.autograph.experimental's), in every DALI with conditionals.
        suite = [do_not_convert(aug) for aug in self.suite]
        for stage in range(self.stages):
            images = select(suite, ops[stage], images, magnitude_bin=signed_bin(bins[stage], signs[stage]),
                            num_magnitude_bins=self.num_bins, fill_value=fill, shape=size)
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
    """The DALI graph: the boxes of normalised HWC `images` (float32, of `size`, (height, width) or a
    DataNode of them) set to 0, plus, with `noise` (pixel mode), the noise placed in them."""
    from nvidia.dali import fn
    images = fn.erase(images, anchor=anchors, shape=shapes, axes=[0, 1], fill_value=0)
    if noise is None:
        return images
    canvas = np.array(size, np.float32) if isinstance(size, tuple) else size
    return images + fn.slice(noise, -anchors, canvas, axes=[0, 1],
                             out_of_bounds_policy='pad', fill_values=0, normalized_anchor=False,
                             normalized_shape=False)
