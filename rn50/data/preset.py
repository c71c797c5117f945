"""The training augmentation, stated once (as torchvision's ClassificationPresetTrain): the random-resized crop
(its area and aspect ratio), the flip, the size of each epoch's images (--progressive-size), the automatic
augmentation and random erasing, repeated augmentation, and ImageRecordIter's own jitters. Built once from the
flags and read by every backend that augments: DALI (dali.py: crop windows and flips drawn in numpy, resize, the
policy of augment.py, erasing) and the native ImageRecordIter (data.py: its crop, flip and jitters);
records.TrainingShard repeats the records (`repeats`). Synthetic data has no augmentation.

    preset = TrainingPreset.of(args)          # contract.Dataset.of, once
    preset.training_shape(epoch)              # (C, H, W) of the epoch's images
    preset.area, preset.aspect_ratio          # the random-resized crop: area fraction, width/height ranges

The crop and flip flags are declared here (add_args, in data.py's "MXNet data backend" group, which DALI honours
too); --progressive-* in resolution.py, --auto-augment, --random-erase* and --aug-repeats in augment.py.
"""
import dataclasses

from rn50 import flags
from rn50.data import resolution


def add_args(group):
    """The crop and flip flags, which both real backends follow (data.py's "MXNet data backend" group)."""
    group.add_argument('--random-mirror', type=int, default=1, choices=(0, 1),
                       help='if or not randomly flip horizontally')
    group.add_argument('--min-random-aspect-ratio', type=flags.optional_float, default=0.75,
                       help='min value of aspect ratio, either None or a positive value')
    group.add_argument('--max-random-aspect-ratio', type=flags.finite_float, default=1.33,
                       help='max value of aspect ratio; with --min-random-aspect-ratio None the range is '
                            '[1 - max, 1 + max]')
    group.add_argument('--max-random-area', type=flags.finite_float, default=1,
                       help='max area to crop in random resized crop, whose range is [0, 1]')
    group.add_argument('--min-random-area', type=flags.finite_float, default=0.08,
                       help='min area to crop in random resized crop, whose range is [0, 1] (the original '
                            'used 0.05 here and 0.08 in DALI; both now use this flag)')


def aspect_ratio_range(low, high):
    """[min, max] width/height ratio of the random crop from --min-random-aspect-ratio (`low`) and
    --max-random-aspect-ratio (`high`): [1 - high, 1 + high] when `low` is None."""
    if low is None:
        return 1 - high, 1 + high
    return low, high


@dataclasses.dataclass(frozen=True)
class AutoAugment:
    """--auto-augment's policy and options (augment.py's AutoAugmentPolicy applies them): `policy` (ta_wide, ra,
    imagenet), RandAugment's operations (`ra_ops`), their number, magnitude, its scale and noise and the
    probability of each, and the `fill` of uncovered pixels (fill_value: one number, or R,G,B)."""
    policy: str
    ra_ops: str = 'torchvision'
    ra_num_ops: int = 2
    ra_magnitude: float = 9
    ra_magnitude_scale: int = 30
    ra_magnitude_std: float = 0.0
    ra_prob: float = 1.0
    fill: object = 0.0


@dataclasses.dataclass(frozen=True)
class TrainingPreset:
    """The whole training augmentation, as values (`of`: the resolved flags): the images' `shape` (C, H, W; the
    crop is resized to it), the crop's `area` fraction and `aspect_ratio` (width/height) ranges, `mirror`
    (--random-mirror, 0 or 1), `progressive` ((size, epochs, step) of --progressive-size, --progressive-epochs and
    --progressive-step, or None) over the run's `num_epochs`, the `auto_augment` (an AutoAugment, or None),
    `random_erase` (its probability) and `erase_mode`, `repeats` (--aug-repeats) and `native`, ImageRecordIter's
    own augmentations as (keyword, value) pairs (the native backend's; the others refuse them,
    data.check_data_flags)."""
    shape: tuple = (3, 224, 224)
    area: tuple = (0.08, 1.0)
    aspect_ratio: tuple = (0.75, 1.33)
    mirror: int = 1
    progressive: tuple = None
    num_epochs: int = 90
    auto_augment: AutoAugment = None
    random_erase: float = 0.0
    erase_mode: str = 'const'
    repeats: int = 1
    native: tuple = ()

    # The flags a resumed run must keep as its state recorded them (fit.RESUMED_SETTINGS); the shape is the
    # network's (Network.RESUMED), the epochs the schedule's.
    RESUMED = ('auto_augment', 'ra_magnitude', 'ra_num_ops', 'random_erase', 'random_erase_mode', 'aug_repeats',
               'progressive_size', 'progressive_epochs', 'progressive_step', 'ra_magnitude_scale', 'ra_magnitude_std',
               'ra_prob', 'ra_ops', 'auto_augment_fill')

    @classmethod
    def of(cls, args):
        progressive = None if args.progressive_size is None else (
            args.progressive_size, args.progressive_epochs, args.progressive_step)
        auto = None if not args.auto_augment else AutoAugment(
            policy=args.auto_augment, ra_ops=args.ra_ops, ra_num_ops=args.ra_num_ops, ra_magnitude=args.ra_magnitude,
            ra_magnitude_scale=args.ra_magnitude_scale, ra_magnitude_std=args.ra_magnitude_std, ra_prob=args.ra_prob,
            fill=fill_value(args.auto_augment_fill, args.rgb_mean))
        native = (('rand_crop', args.random_crop), ('random_resized_crop', args.random_resized_crop),
                  ('random_h', args.max_random_h), ('random_s', args.max_random_s), ('random_l', args.max_random_l),
                  ('max_rotate_angle', args.max_random_rotate_angle),
                  ('max_shear_ratio', args.max_random_shear_ratio), ('max_random_scale', args.max_random_scale),
                  ('min_random_scale', args.min_random_scale), ('min_crop_size', args.min_crop_size),
                  ('max_crop_size', args.max_crop_size), ('brightness', args.brightness),
                  ('contrast', args.contrast), ('saturation', args.saturation), ('pca_noise', args.pca_noise),
                  ('pad', args.pad_size))
        return cls(shape=tuple(args.image_shape), area=(args.min_random_area, args.max_random_area),
                   aspect_ratio=aspect_ratio_range(args.min_random_aspect_ratio, args.max_random_aspect_ratio),
                   mirror=args.random_mirror, progressive=progressive, num_epochs=args.num_epochs, auto_augment=auto,
                   random_erase=args.random_erase, erase_mode=args.random_erase_mode, repeats=args.aug_repeats,
                   native=native)

    def training_shape(self, epoch):
        """(C, H, W) of the training images of `epoch` (resolution.size_at of --progressive-size)."""
        if self.progressive is None:
            return tuple(self.shape)
        low, epochs, step = self.progressive
        size = resolution.size_at(epoch, low, self.shape[1], *resolution.ramp(epochs, self.num_epochs), step)
        return (self.shape[0], size, size)


def fill_value(fill, mean):
    """--auto-augment-fill (`fill`) as DALI's fill: one number, or a tuple of 3 for a colour of unequal channels;
    'mean' is --rgb-mean (`mean`) rounded."""
    if fill == 'mean':
        fill = tuple(min(255, max(0, round(m))) for m in mean)
    if isinstance(fill, tuple) and len(set(fill)) == 1:
        fill = fill[0]
    return fill
