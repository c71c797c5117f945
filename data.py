"""Data: the Data and MXNet-augmentation flags, the native RecordIO and synthetic loaders, and image loading
for prediction. The DALI loaders live in dali.py and follow the same contract.

    python train.py --data-backend mxnet --data-train data/train.rec --data-train-idx data/train.idx ...
    python train.py --data-backend synthetic --test-io     # loader throughput alone
    train.get_loaders(args, rank, num_workers)             # -> (train loader, val loader), any backend

A loader has `batch_size` (per worker: --batch-size is the global batch), `num_batches` (per epoch, equal on
every worker for training, since Horovod needs equal step counts), `num_examples`, and `epoch(e, start)`,
a generator of `mx.io.DataBatch(data=[images], label=[labels], pad=p)` for epoch e from batch `start`.
Images are normalised ((x - mean) / std on the 0-255 scale), in --input-layout and the training dtype, with a
zero 4th channel when --image-shape has 4 channels. `pad` counts the filler samples at the end of a batch.

Semantics shared by every backend:
* Training: random-resized-crop (area --min-random-area..--max-random-area, default 8-100%, aspect
  --min/max-random-aspect-ratio), horizontal flip, normalisation. Shards by global rank: over all workers an
  epoch covers each of the --num-examples records once (default: every record of the .idx), plus filler
  to give every worker the same number of full batches.
* Validation: shorter side resized to --data-val-resize, center crop, each record seen once over all
  workers, the last batch padded and its pad reported.
* Determinism: the batches of (seed, epoch, rank, workers) are fixed, so `epoch(e, k)` continues exactly
  where an interrupted `epoch(e)` stopped (exact resume). The native iterator is re-created per epoch with a
  seed derived from (seed, epoch) and fast-forwarded to batch k.
* Bad data fails before training: a missing file, an .idx that does not match its .rec, or a label outside
  [0, --num-classes) is a RecipeError naming the file and record.
* Synthetic data has the shapes and dtypes of the real path; its validation set is ImageNet's share of the
  epoch (50,000 for the default 1,281,167). Its validation labels are random and independent of its training
  data, so validation accuracy stays at chance: it measures speed, not learning.
"""
import io
import logging
import os
import struct

import mxnet as mx
import numpy as np

import flags
from errors import RecipeError, mxnet_message

log = logging.getLogger(__name__)

BACKENDS = ('dali-gpu', 'dali-cpu', 'mxnet', 'synthetic')
IMAGENET_TRAIN_SIZE = 1281167
IMAGENET_VAL_SIZE = 50000
RECORD_MAGIC = 0xced7230a


# Augmentations only ImageRecordIter implements: flag, type, default (= off), help. The other backends
# refuse them rather than ignore them.
NATIVE_AUGMENTATIONS = (
    ('--random-crop', int, 0, 'if or not randomly crop the image'),
    ('--max-random-h', int, 0, 'max change of hue, whose range is [0, 180]'),
    ('--max-random-s', int, 0, 'max change of saturation, whose range is [0, 255]'),
    ('--max-random-l', int, 0, 'max change of intensity, whose range is [0, 255]'),
    ('--max-random-rotate-angle', int, 0, 'max angle to rotate, whose range is [0, 360]'),
    ('--max-random-shear-ratio', flags.finite_float, 0, 'max ratio to shear, whose range is [0, 1]'),
    ('--max-random-scale', flags.finite_float, 1, 'max ratio to scale'),
    ('--min-random-scale', flags.finite_float, 1, 'min ratio to scale, should >= img_size/input_shape. otherwise use '
                                     '--pad-size'),
    ('--min-crop-size', int, -1, 'Crop both width and height into a random size in [min_crop_size, '
                                 'max_crop_size]'),
    ('--max-crop-size', int, -1, 'Crop both width and height into a random size in [min_crop_size, '
                                 'max_crop_size]'),
    ('--brightness', flags.finite_float, 0, 'brightness jittering, whose range is [0, 1]'),
    ('--contrast', flags.finite_float, 0, 'contrast jittering, whose range is [0, 1]'),
    ('--saturation', flags.finite_float, 0, 'saturation jittering, whose range is [0, 1]'),
    ('--pca-noise', flags.finite_float, 0, 'pca noise, whose range is [0, 1]'),
    ('--pad-size', int, 0, 'padding the input image'),
)
# ImageRecordIter refuses these together with random_resized_crop.
RESIZED_CROP_CONFLICTS = ('--random-crop', '--max-random-scale', '--min-random-scale', '--min-crop-size',
                          '--max-crop-size')


def add_data_args(parser):
    group = parser.add_argument_group('Data', 'the input images')
    group.add_argument('--data-train', help='the training data (.rec)')
    group.add_argument('--data-train-idx', default='', help='the index of training data (.idx)')
    group.add_argument('--data-val', help='the validation data (.rec)')
    group.add_argument('--data-val-idx', default='', help='the index of validation data (.idx)')
    group.add_argument('--data-pred', help='pred mode: an image, or a folder of images, to classify')
    group.add_argument('--data-backend', default=None, choices=BACKENDS,
                       help='data loading and augmentation backend (default: dali-gpu, or dali-cpu on a '
                            'machine without a GPU)')
    group.add_argument('--image-shape', type=flags.image_shape, default=(3, 224, 224),
                       help='the image shape fed into the network: C,H,W with C = 3, or 4 for a zero 4th '
                            'channel')
    group.add_argument('--rgb-mean', type=flags.float_tuple, default=(123.68, 116.779, 103.939),
                       help='a tuple of size 3 for the mean rgb')
    group.add_argument('--rgb-std', type=flags.float_tuple, default=(58.393, 57.12, 57.375),
                       help='a tuple of size 3 for the std rgb')
    for name, what in (('input', 'the input data'), ('conv', 'the conv operation'),
                       ('batchnorm', 'the batchnorm operation'), ('pooling', 'the pooling operation')):
        group.add_argument(f'--{name}-layout', default='NCHW', choices=['NCHW', 'NHWC'],
                           help=f'the layout of the data assumed by {what}')
    group.add_argument('--num-examples', type=flags.integer(minimum=1), default=None,
                       help='training examples per epoch (default: the records in --data-train-idx; '
                            f'{IMAGENET_TRAIN_SIZE} for synthetic data)')
    group.add_argument('--data-val-resize', type=flags.integer(minimum=1), default=256,
                       help='base length of shorter edge for validation dataset')
    return group


def add_data_aug_args(parser):
    group = parser.add_argument_group(
        'MXNet data backend', 'augmentations of --data-backend mxnet (ImageRecordIter). DALI honours '
        '--random-mirror and the area and aspect-ratio flags, and refuses the others')
    group.add_argument('--data-mxnet-threads', type=flags.integer(minimum=1), default=40,
                       help='number of threads for data decoding for mxnet data backend')
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
    group.add_argument('--random-resized-crop', type=int, default=1, choices=(0, 1),
                       help='whether to use random resized crop')
    for flag, kind, default, text in NATIVE_AUGMENTATIONS:
        group.add_argument(flag, type=kind, default=default, help=text)
    return group


def resolve_backend(args):
    """Default backend: dali-gpu, or dali-cpu without a GPU (said once). An explicit dali-gpu without a GPU,
    or data flags that cannot work together, are errors."""
    has_gpu = mx.context.num_gpus() > 0
    if args.data_backend is None:
        args.data_backend = 'dali-gpu' if has_gpu else 'dali-cpu'
        if not has_gpu:
            log.info('No GPU: --data-backend defaults to dali-cpu')
    elif args.data_backend == 'dali-gpu' and not has_gpu:
        raise RecipeError('--data-backend dali-gpu needs a GPU and this machine has none: use --data-backend '
                          'dali-cpu (or mxnet)')
    check_data_flags(args)
    if args.mode in ('train', 'train_val') and not args.test_io and args.data_backend != 'synthetic' \
            and not args.data_train:
        raise RecipeError(f'--mode {args.mode} needs --data-train (or --data-backend synthetic)')


def check_data_flags(args):
    """RecipeError for data flags that are out of range, or that the chosen backend would ignore."""
    shape = args.image_shape
    if len(args.rgb_mean) != 3 or len(args.rgb_std) != 3 or min(args.rgb_std) <= 0:
        raise RecipeError('--rgb-mean and --rgb-std take 3 values each (R,G,B), the std values positive')
    if args.data_val_resize < max(shape[1:]):
        raise RecipeError(f'--data-val-resize {args.data_val_resize} is smaller than the image ({shape[1]}x'
                          f'{shape[2]}): the center crop would not fit')
    if not 0 < args.min_random_area <= args.max_random_area <= 1:
        raise RecipeError(f'--min-random-area {args.min_random_area} and --max-random-area '
                          f'{args.max_random_area}: expected 0 < min <= max <= 1')
    low, high = aspect_ratio_range(args)
    if not 0 < low <= high:
        raise RecipeError(f'aspect ratio range [{low}, {high}] from --min/max-random-aspect-ratio: expected '
                          '0 < min <= max')
    changed = [flag for flag, _, default, _ in NATIVE_AUGMENTATIONS if flag_value(args, flag) != default]
    if args.data_backend == 'mxnet':
        conflicts = [flag for flag in RESIZED_CROP_CONFLICTS if flag in changed]
        if args.random_resized_crop and conflicts:
            raise RecipeError(f'{", ".join(conflicts)} cannot be combined with --random-resized-crop 1 '
                              '(ImageRecordIter refuses it): add --random-resized-crop 0')
    elif changed or not args.random_resized_crop:
        what = ', '.join(changed) if changed else '--random-resized-crop 0'
        raise RecipeError(f'{what}: only --data-backend mxnet (ImageRecordIter) implements this; '
                          f'--data-backend {args.data_backend} always uses random-resized-crop with the area and '
                          'aspect-ratio flags and --random-mirror')


def flag_value(args, flag):
    return getattr(args, flag[2:].replace('-', '_'))


def aspect_ratio_range(args):
    """[min, max] width/height ratio of the random crop: [1 - max, 1 + max] when the min flag is None."""
    if args.min_random_aspect_ratio is None:
        return 1 - args.max_random_aspect_ratio, 1 + args.max_random_aspect_ratio
    return args.min_random_aspect_ratio, args.max_random_aspect_ratio


def training_dtype(args):
    """The dtype the network consumes: float16 only for --dtype float16 without AMP."""
    return 'float16' if args.dtype == 'float16' and not args.amp else 'float32'


def per_worker_batch(args, num_workers):
    if args.batch_size % num_workers:
        raise RecipeError(f'--batch-size {args.batch_size} is not divisible by the {num_workers} workers')
    return args.batch_size // num_workers


# ----------------------------------------------------------------------------------------------------------
# RecordIO files: checks done once before training


class RecordFile:
    """A .rec file and its .idx, checked: the index offsets point at records, labels are in range."""

    def __init__(self, rec_path, idx_path, num_classes, what):
        if not rec_path or not os.path.exists(rec_path):
            raise RecipeError(f'{what} data {rec_path!r} not found')
        idx_path = idx_path or os.path.splitext(rec_path)[0] + '.idx'
        if not os.path.exists(idx_path):
            raise RecipeError(f'{what} index {idx_path!r} not found: make it with scripts/prepare_dataset.py '
                              '(or im2rec.py) next to the .rec, or pass --data-{train,val}-idx')
        self.rec_path, self.idx_path, self.what = rec_path, idx_path, what
        self.offsets = read_index(idx_path)
        if len(self.offsets) == 0:
            raise RecipeError(f'{what} index {idx_path} lists no records')
        self.labels = self._read_labels()
        bad = np.flatnonzero((self.labels < 0) | (self.labels >= num_classes) | (self.labels != np.floor(
            self.labels)))
        if len(bad):
            raise RecipeError(f'{what} record {int(bad[0])} of {rec_path} has label {self.labels[bad[0]]:g}, outside '
                              f'[0, {num_classes}) ({len(bad)} such records): check --num-classes')

    def __len__(self):
        return len(self.offsets)

    def _read_labels(self):
        """Each record's label from its header, after checking the .idx offsets land on record headers."""
        size = os.path.getsize(self.rec_path)
        labels = np.empty(len(self.offsets), dtype=np.float64)
        with open(self.rec_path, 'rb') as f:
            for i, offset in enumerate(self.offsets):
                f.seek(offset)
                head = f.read(8 + 24)
                if offset >= size or len(head) < 32 or struct.unpack('<I', head[:4])[0] != RECORD_MAGIC:
                    raise RecipeError(f'{self.what} index {self.idx_path} does not match {self.rec_path}: entry {i} '
                                      f'(offset {offset}) is not a record. Rebuild the index with the data')
                flag, label = struct.unpack('<If', head[8:16])
                labels[i] = label if flag == 0 else np.nan
        return labels


def read_index(idx_path):
    """Byte offsets of the records, in index order, from an im2rec-style .idx (key<TAB>offset lines)."""
    offsets = []
    with open(idx_path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                offsets.append(int(fields[1]))
            except (IndexError, ValueError):
                raise RecipeError(f'{idx_path} line {number} is not "key<TAB>offset": {line.strip()!r}') from None
    return offsets


def read_record(f, offset):
    """(header flag, label, image bytes) of the record at `offset` of an open .rec file."""
    f.seek(offset)
    magic, length = struct.unpack('<II', f.read(8))
    payload = f.read(length & ((1 << 29) - 1))
    flag, label = struct.unpack('<If', payload[:8])
    return flag, label, payload[24 + 4 * flag:]


def find_undecodable(records, first, count):
    """Index of the first record in [first, first + count) whose image does not fully decode, else None.
    Pillow is strict about truncated files, as DALI's and OpenCV's decoders are."""
    from PIL import Image
    with open(records.rec_path, 'rb') as f:
        for index in range(first, min(first + count, len(records))):
            try:
                with Image.open(io.BytesIO(read_record(f, records.offsets[index])[2])) as image:
                    image.load()
            except Exception:  # Pillow raises many types for bad data; any of them means undecodable
                return index
    return None


def undecodable_message(records, first, count, error):
    """A RecipeError message for a decoder failure: which record, and what to do."""
    bad = find_undecodable(records, first, count)
    where = f'record {bad} of {records.rec_path} cannot be decoded' if bad is not None else \
        f'decoding {records.rec_path} failed'
    first_line = mxnet_message(error)[:200]
    return f'{where} ({first_line}). Rebuild the dataset with scripts/prepare_dataset.py, which skips ' \
           'unreadable images'


# ----------------------------------------------------------------------------------------------------------
# Shared batch shaping


def batches(loader, epoch, start, count):
    """`count` batches of `epoch` from index `start`, wrapping around the data when count exceeds the epoch
    (only --benchmark-iters asks for that)."""
    produced = 0
    while produced < count:
        for batch in loader.epoch(epoch, start):
            yield batch
            produced += 1
            if produced == count:
                return
        start = 0


def epoch_seed(seed, *keys):
    """A 31-bit seed from --seed (None: 0) and integer keys such as (epoch, rank)."""
    return int(np.random.SeedSequence([seed or 0, *keys]).generate_state(1)[0] & 0x7fffffff)


def finish_images(images, args):
    """NCHW float32 normalised images -> the layout, channel count and dtype the network takes."""
    if args.image_shape[0] == 4:
        images = mx.nd.concat(images, mx.nd.zeros_like(images[:, :1]), dim=1)
    if args.input_layout == 'NHWC':
        images = mx.nd.transpose(images, axes=(0, 2, 3, 1))
    dtype = training_dtype(args)
    return images if images.dtype == np.dtype(dtype) else images.astype(dtype)


def filler_pad(batch_index, batch_size, real_samples):
    """How many samples of batch `batch_index` lie beyond this worker's `real_samples`."""
    return int(min(batch_size, max(0, (batch_index + 1) * batch_size - real_samples)))


def shard_size(total, rank, num_workers):
    """Records in shard `rank` of DALI's contiguous split: [total*r//W, total*(r+1)//W)."""
    return (total * (rank + 1)) // num_workers - (total * rank) // num_workers


def record_iter_shard_size(total, rank, num_workers):
    """Records in part `rank` of ImageRecordIter's split: chunks of ceil(total/W), the last one shorter."""
    step = -(-total // num_workers)
    return max(0, min(total, (rank + 1) * step) - rank * step)


class RecordLoader:
    """--data-backend mxnet: MXNet's C++ ImageRecordIter (decode and augmentation on CPU threads)."""

    def __init__(self, args, rank, num_workers, training):
        self.args, self.rank, self.num_workers, self.training = args, rank, num_workers, training
        self.batch_size = per_worker_batch(args, num_workers)
        what = 'training' if training else 'validation'
        rec, idx = (args.data_train, args.data_train_idx) if training else (args.data_val, args.data_val_idx)
        self.records = RecordFile(rec, idx, args.num_classes, what)
        if training:
            self.num_examples = args.num_examples or len(self.records)
            self.num_batches = -(-(-(-self.num_examples // num_workers)) // self.batch_size)
        else:
            self.num_examples = len(self.records)
            self.num_batches = -(-record_iter_shard_size(self.num_examples, rank, num_workers) // self.batch_size)

    def _iterator(self, seed):
        args = self.args
        common = dict(path_imgrec=self.records.rec_path, path_imgidx=self.records.idx_path,
                      data_shape=(3,) + tuple(args.image_shape[1:]), batch_size=self.batch_size,
                      label_width=1, preprocess_threads=args.data_mxnet_threads,
                      mean_r=args.rgb_mean[0], mean_g=args.rgb_mean[1], mean_b=args.rgb_mean[2],
                      std_r=args.rgb_std[0], std_g=args.rgb_std[1], std_b=args.rgb_std[2],
                      num_parts=self.num_workers, part_index=self.rank)
        if not self.training:
            # round_batch: the last batch is filled from the start and its pad is right (without it,
            # ImageRecordIter reports pad 0 and garbage labels for the partial batch).
            return mx.io.ImageRecordIter(resize=args.data_val_resize, rand_crop=False, rand_mirror=False,
                                         shuffle=False, round_batch=True, **common)
        return mx.io.ImageRecordIter(
            shuffle=True, seed=seed, seed_aug=seed ^ 1,  # augmentation seed: fixed per epoch too
            round_batch=True, rand_crop=args.random_crop,
            rand_mirror=args.random_mirror, random_resized_crop=args.random_resized_crop,
            min_random_area=args.min_random_area, max_random_area=args.max_random_area,
            min_aspect_ratio=aspect_ratio_range(args)[0], max_aspect_ratio=aspect_ratio_range(args)[1],
            random_h=args.max_random_h, random_s=args.max_random_s, random_l=args.max_random_l,
            max_rotate_angle=args.max_random_rotate_angle, max_shear_ratio=args.max_random_shear_ratio,
            max_random_scale=args.max_random_scale, min_random_scale=args.min_random_scale,
            min_crop_size=args.min_crop_size, max_crop_size=args.max_crop_size, brightness=args.brightness,
            contrast=args.contrast, saturation=args.saturation, pca_noise=args.pca_noise, pad=args.pad_size,
            **common)

    def epoch(self, epoch, start=0):
        """The epoch's batches from `start` (see _batches); a decoder failure (ImageRecordIter stops on an
        undecodable JPEG) becomes a RecipeError naming the record."""
        try:
            yield from self._batches(epoch, start)
        except mx.base.MXNetError as e:
            first = self.rank * -(-len(self.records) // self.num_workers)
            count = record_iter_shard_size(len(self.records), self.rank, self.num_workers)
            raise RecipeError(undecodable_message(self.records, first, count, e)) from e

    def _batches(self, epoch, start):
        """The iterator for this epoch's seed, fast-forwarded to `start`, and restarted (same seed) if this
        shard runs out before num_batches: batches past the shard's end are filler. A batch, like those of
        MXNet's own iterators, is valid until the next one is requested."""
        iterator = self._iterator(epoch_seed(self.args.seed, epoch))
        produced, first_pass = 0, True
        while True:
            for batch in iterator:
                if produced >= start:
                    pad = batch.pad if first_pass else self.batch_size
                    yield mx.io.DataBatch(data=[finish_images(batch.data[0], self.args)], label=batch.label,
                                          pad=pad)
                produced += 1
                if produced == self.num_batches:
                    return
            iterator.reset()
            first_pass = False


class SyntheticLoader:
    """--data-backend synthetic: fixed random batches, no decoding (measures the training step alone).

    The training batch of worker r is slice r of one global batch drawn from the seed, so 1 and N workers
    see the same global batch. Validation images and labels are drawn independently: chance accuracy."""

    def __init__(self, args, rank, num_workers, training):
        self.args = args
        self.batch_size = per_worker_batch(args, num_workers)
        train_examples = args.num_examples or IMAGENET_TRAIN_SIZE
        if training:
            self.num_examples = train_examples
            self.num_batches = -(-(-(-self.num_examples // num_workers)) // self.batch_size)
        else:
            # ImageNet's validation/training ratio: 50,000 images for the default epoch of 1,281,167.
            self.num_examples = max(1, round(IMAGENET_VAL_SIZE * train_examples / IMAGENET_TRAIN_SIZE))
            self.num_batches = -(-shard_size(self.num_examples, rank, num_workers) // self.batch_size)
        first = rank * self.batch_size
        stream = 0 if training else 1
        shape = (3,) + tuple(args.image_shape[1:])
        images = np.stack([np.random.default_rng([args.seed or 0, stream, first + i]).uniform(-1, 1, shape)
                           for i in range(self.batch_size)]).astype(np.float32)
        labels = np.random.default_rng([args.seed or 0, stream]).integers(
            0, args.num_classes, size=self.batch_size * num_workers)[first:first + self.batch_size]
        self.batch = mx.io.DataBatch(data=[finish_images(mx.nd.array(images), args)],
                                     label=[mx.nd.array(labels, dtype='float32')], pad=0)

    def epoch(self, epoch, start=0):
        for _ in range(start, self.num_batches):
            yield self.batch


# ----------------------------------------------------------------------------------------------------------
# Prediction input


def load_image(path, args):
    """One image file as a network input batch of 1, with validation preprocessing (shorter side to
    --data-val-resize, center crop to --image-shape, normalisation, layout, dtype, 4th channel)."""
    try:
        with open(path, 'rb') as f:
            image = mx.image.imdecode(f.read(), to_rgb=1)
    except (OSError, mx.base.MXNetError) as e:
        raise RecipeError(f'cannot read image {path}: {mxnet_message(e)}') from e
    height, width = args.image_shape[1:]
    image = mx.image.resize_short(image, args.data_val_resize)
    image, _ = mx.image.center_crop(image, (width, height))
    image = (image.astype('float32') - mx.nd.array(args.rgb_mean)) / mx.nd.array(args.rgb_std)
    return finish_images(mx.nd.transpose(image, axes=(2, 0, 1)).expand_dims(0), args)
