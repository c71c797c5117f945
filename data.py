"""Data: the Data and MXNet-augmentation flags and the native RecordIO loader (--data-backend mxnet). Every
loader (this one, dali.py's and rn50/data/synthetic.py's) follows the contract of rn50/data/contract.py and
takes its records (a contract.Dataset: files, batch, Images, the training preset of rn50/data/preset.py);
rn50/data/validation_resize.py holds the validation geometry that val, pred and export share.

    python train.py --data-backend synthetic --test-io     # loader throughput alone
    train.get_loaders(args, rank, num_workers)             # -> (train loader, val loader), any backend
    data.RecordLoader(dataset, data.Options.of(args), rank, num_workers, training)   # or RecordLoader.of(args, ...)
"""
import dataclasses
import logging
import os
import shutil
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import mxnet as mx
import numpy as np

from rn50 import flags
from rn50.data import augment
from rn50.data import preset
from rn50.data import records
from rn50.data import resolution
from rn50.data.contract import IMAGENET_TRAIN_SIZE, Dataset, Images, batches, on_devices, per_worker_batch
from rn50.data.validation_resize import describe_val_resize
from rn50.errors import RecipeError
from rn50.reports import logs

log = logging.getLogger(__name__)

BACKENDS = ('dali-gpu', 'dali-cpu', 'mxnet', 'synthetic')


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
    group.add_argument('--val-image-shape', type=flags.image_shape, default=None,
                       help='the image shape of validation, pred and export (default: --image-shape; the channels '
                            'are always --image-shape\'s): train at 176 and test at 224 after a 232 resize with '
                            '--image-shape 3,176,176 --val-image-shape 3,224,224 --data-val-resize 232')
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
    group.add_argument('--data-val-resize', type=flags.integer(minimum=1), default=None,
                       help='base length of shorter edge for validation dataset (default: the test size x 256/224, '
                            '256 at 224; a --recipe sets its own)')
    resolution.add_args(group)
    return group


def add_data_aug_args(parser):
    group = parser.add_argument_group(
        'MXNet data backend', 'augmentations of --data-backend mxnet (ImageRecordIter). DALI honours '
        '--random-mirror and the area and aspect-ratio flags, and refuses the others')
    group.add_argument('--data-mxnet-threads', type=flags.integer(minimum=1), default=40,
                       help='number of threads for data decoding for mxnet data backend')
    preset.add_args(group)     # the crop and flip, which DALI follows too
    group.add_argument('--random-resized-crop', type=int, default=1, choices=(0, 1),
                       help='whether to use random resized crop')
    for flag, kind, default, text in NATIVE_AUGMENTATIONS:
        group.add_argument(flag, type=kind, default=default, help=text)
    return group


def check_backend(args, given, on_gpu, local=True):
    """RecipeError for an explicit dali-gpu where the workers have no GPU (`on_gpu`: whether they have), data
    flags that cannot work together (`given`: the destinations of the flags the command named, for flags that
    would be ignored), and training without training data. `local`: the workers run on this machine, so its
    DALI is theirs (False: the runner plans for other nodes, whose workers check it). The backend's default is
    rn50/config/resolve.py's."""
    if args.data_backend == 'dali-gpu' and not on_gpu:
        raise RecipeError('--data-backend dali-gpu needs a GPU and this machine has none: use --data-backend '
                          'dali-cpu (or mxnet)')
    check_data_flags(args, given, local)
    if args.mode in ('train', 'train_val') and not args.test_io and args.data_backend != 'synthetic' \
            and not args.data_train:
        raise RecipeError(f'--mode {args.mode} needs --data-train (or --data-backend synthetic)')


def check_data_flags(args, given, local=True):
    """RecipeError for data flags that are out of range, or that the chosen backend would ignore (`given`: the
    destinations of the flags the command named; `local`: check_backend's)."""
    shape = Images.of(args).shape_of(training=False)
    if len(args.rgb_mean) != 3 or len(args.rgb_std) != 3 or min(args.rgb_std) <= 0:
        raise RecipeError('--rgb-mean and --rgb-std take 3 values each (R,G,B), the std values positive')
    if args.data_val_resize < max(shape[1:]):
        raise RecipeError(f'--data-val-resize {args.data_val_resize} is smaller than the image ({shape[1]}x'
                          f'{shape[2]}): the center crop would not fit')
    if not 0 < args.min_random_area <= args.max_random_area <= 1:
        raise RecipeError(f'--min-random-area {args.min_random_area} and --max-random-area '
                          f'{args.max_random_area}: expected 0 < min <= max <= 1')
    low, high = preset.aspect_ratio_range(args.min_random_aspect_ratio, args.max_random_aspect_ratio)
    if not 0 < low <= high:
        raise RecipeError(f'aspect ratio range [{low}, {high}] from --min/max-random-aspect-ratio: expected '
                          '0 < min <= max')
    augment.check(preset.TrainingPreset.of(args), args.data_backend, given, args.mode in ('train', 'train_val'), local)
    resolution.check(args.progressive_size, args.progressive_epochs, args.image_shape, args.data_backend,
                     args.num_epochs)
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


@dataclasses.dataclass(frozen=True)
class Options:
    """The native backend's own settings (`of`: the flags): ImageRecordIter's decoding threads
    (--data-mxnet-threads)."""
    threads: int = 40

    @classmethod
    def of(cls, args):
        return cls(threads=args.data_mxnet_threads)


# The native training loader hands ImageRecordIter chunks of about this many images, written in the epoch's
# order to a temporary .rec and .idx (ImageRecordIter cannot follow an order of ours: without shuffle it reads
# the file in file order whatever the index says, and with shuffle it draws its own order; see docs/data.md). An
# iterator costs about 25 ms to create, hidden by building the next chunk while this one is read; a resume
# decodes at most the chunk's batches before the one asked for (none from a batch of 256 up).
CHUNK_IMAGES = 256


class Chunk:
    """One chunk of the native training loader: its records, in the epoch's order, in a .rec and .idx of a
    folder of its own, and the ImageRecordIter that reads them.

    The folder is the chunk's alone because constructing an ImageRecordIter lists the folder of its .rec and
    of its .idx and stats every entry there (MXNet 1.9.1's dmlc-core: InputSplitBase::ConvertToURIs calls
    LocalFileSystem::ListDirectory, which fails with "LocalFileSystem.GetPathInfo: <entry> error: No such
    file or directory" when an entry is removed between the listing and its stat). When the chunks shared
    one folder, the removal of the chunk just read raced with the construction of the next one in the
    background thread: about one epoch in 20 failed (issue 24)."""

    def __init__(self, folder, iterator, indices):
        self.folder, self.iterator, self.indices = folder, iterator, indices

    def release(self):
        """Free the iterator (its C++ destructor joins its threads), then remove the folder. An iterator
        still referenced elsewhere (the traceback of its decoding error holds its frame) keeps its files:
        the loader's folder is removed with the loader."""
        iterator = weakref.ref(self.iterator)
        self.iterator = None
        if iterator() is None:
            shutil.rmtree(self.folder, ignore_errors=True)


class RecordLoader:
    """--data-backend mxnet: MXNet's C++ ImageRecordIter (decode and augmentation on CPU threads).

    Training reads the records of TrainingShard itself and feeds them to ImageRecordIter in chunks of
    ceil(CHUNK_IMAGES / batch) batches, one iterator per chunk with an augmentation seed from (seed, epoch,
    rank, chunk): batch k of an epoch is fixed, and `epoch(e, k)` starts at k's chunk (exact resume, at most
    the chunk's earlier batches decoded in vain). Augmentation is ImageRecordIter's, with all its flags.
    Validation reads the file in order with ImageRecordIter's own split. `dataset`: a contract.Dataset (its
    files, batch, classes, Images and training preset); `options`: Options."""

    def __init__(self, dataset, options, rank, num_workers, training, contexts=(mx.cpu(),), seed=0):
        self.dataset, self.options = dataset, options
        self.images, self.preset = dataset.images, dataset.preset
        self.rank, self.num_workers, self.training = rank, num_workers, training
        self.contexts, self.seed = contexts, seed
        self.batch_size = per_worker_batch(dataset.batch_size, num_workers)
        what = 'training' if training else 'validation'
        rec, idx = dataset.train if training else dataset.val
        self.records = records.RecordFile(rec, idx, dataset.num_classes, what)
        if training:
            self.num_examples = dataset.num_examples or len(self.records)
            self.shard = records.TrainingShard(len(self.records), self.num_examples, rank, num_workers, self.batch_size,
                                               seed, self.preset.repeats)
            self.num_batches = self.shard.num_batches
            self.chunk_batches = max(1, -(-CHUNK_IMAGES // self.batch_size))
        else:
            self.num_examples = len(self.records)
            self.part = records.record_iter_part(self.num_examples, rank, num_workers)
            self.num_batches = -(-len(self.part) // self.batch_size)
        # ImageRecordIter's construction lists the folder of its files and fails if an entry there vanishes
        # meanwhile (see Chunk), so it only ever opens files in a folder of ours: the training chunks, or
        # links to the validation files (whose own folder may be shared, such as /tmp).
        self.workdir = tempfile.mkdtemp(prefix='rn50-chunks-' if training else 'rn50-val-')
        weakref.finalize(self, shutil.rmtree, self.workdir, True)
        if not training:
            self.linked = os.path.join(self.workdir, 'val')
            os.symlink(os.path.abspath(self.records.rec_path), self.linked + '.rec')
            os.symlink(os.path.abspath(self.records.idx_path), self.linked + '.idx')
            if self.images.val_interpolation == 'linear-antialias':
                raise RecipeError('--data-backend mxnet: ImageRecordIter cannot resize as this run validates (linear, '
                                  'antialiased: DALI\'s): leave --data-backend out, or use dali-cpu')
            log.info('Validation with ImageRecordIter: %s', describe_val_resize(self.images))

    @classmethod
    def of(cls, args, rank, num_workers, training, contexts=(mx.cpu(),), seed=0):
        """The loader of the resolved flags `args` (its records made here)."""
        return cls(Dataset.of(args), Options.of(args), rank, num_workers, training, contexts, seed)

    def _common(self, shape):
        mean, std = self.images.mean, self.images.std
        return dict(data_shape=(3,) + tuple(shape[1:]), batch_size=self.batch_size,
                    label_width=1, preprocess_threads=self.options.threads, verbose=False,
                    mean_r=mean[0], mean_g=mean[1], mean_b=mean[2], std_r=std[0], std_g=std[1], std_b=std[2])

    def _training_iterator(self, path, seed, shape):
        """ImageRecordIter over a chunk, augmenting as the training preset says: its crop, flip and jitters."""
        preset = self.preset
        low, high = preset.aspect_ratio
        return mx.io.ImageRecordIter(
            path_imgrec=path + '.rec', path_imgidx=path + '.idx', shuffle=False, round_batch=False, seed_aug=seed,
            rand_mirror=preset.mirror, min_random_area=preset.area[0], max_random_area=preset.area[1],
            min_aspect_ratio=low, max_aspect_ratio=high, **dict(preset.native), **self._common(shape))

    def epoch(self, epoch, start=0):
        """The epoch's batches from `start`. A batch, like those of MXNet's own iterators, is valid until the
        next one is requested."""
        if self.training:
            yield from self._training_batches(epoch, start)
            return
        try:
            yield from self._validation_batches(start)
        except mx.base.MXNetError as e:
            raise RecipeError(records.undecodable_message(self.records, self.part, e)) from e

    def _chunk(self, epoch, chunk):
        """The Chunk of these batches, its iterator constructed: run in a background thread, so the next
        chunk is written (and starts decoding) while this one is read."""
        first = chunk * self.chunk_batches
        batches = range(first, min(first + self.chunk_batches, self.num_batches))
        indices = np.concatenate([self.shard.batch(epoch, i)[0] for i in batches])
        folder = tempfile.mkdtemp(prefix=f'e{epoch}-c{chunk}-', dir=self.workdir)
        path = os.path.join(folder, 'chunk')
        sizes = []
        with open(path + '.rec', 'wb') as f:
            for begin in range(0, len(indices), 256):
                stored = self.records.read(indices[begin:begin + 256], whole=True)[0]
                f.write(b''.join(stored))
                sizes += map(len, stored)
        # With an index ImageRecordIter reads batch by batch (without one it decodes a whole read buffer,
        # up to thousands of small images, before the first batch); its entries are in file order.
        offsets = np.cumsum([0] + sizes[:-1])
        with open(path + '.idx', 'w') as f:
            f.write(''.join(f'{i}\t{offset}\n' for i, offset in enumerate(offsets)))
        try:
            iterator = self._training_iterator(path, records.epoch_seed(self.seed, epoch, self.rank, chunk),
                                               self.preset.training_shape(epoch))
        except mx.base.MXNetError as e:
            shutil.rmtree(folder, ignore_errors=True)
            raise RecipeError(records.undecodable_message(self.records, indices, e)) from e
        return Chunk(folder, iterator, indices)

    def _training_batches(self, epoch, start):
        if start >= self.num_batches:
            return
        pool = ThreadPoolExecutor(1)
        chunk = start // self.chunk_batches
        pending = pool.submit(self._chunk, epoch, chunk)
        try:
            while pending is not None:
                current = pending.result()
                first = chunk * self.chunk_batches
                chunk += 1
                pending = pool.submit(self._chunk, epoch, chunk) \
                    if chunk * self.chunk_batches < self.num_batches else None
                try:
                    for index, batch in enumerate(current.iterator, first):
                        if index >= start:
                            images, labels = on_devices(batch.data[0], batch.label[0], self.images, self.contexts)
                            yield mx.io.DataBatch(data=[images], label=[labels], pad=self.shard.batch(epoch, index)[1])
                except mx.base.MXNetError as e:
                    raise RecipeError(records.undecodable_message(self.records, current.indices, e)) from e
                finally:
                    current.release()
        finally:
            if pending is not None:     # abandoned or failed: drop the chunk read ahead
                try:
                    pending.result().release()
                except Exception:  # its own error is not ours to report here
                    pass
            pool.shutdown(wait=True)

    def _validation_batches(self, start):
        """ImageRecordIter in file order over its part of the file; round_batch fills the last batch from
        the start and reports its pad (without it, ImageRecordIter reports pad 0 and garbage labels). Labels
        are checked batch by batch."""
        iterator = mx.io.ImageRecordIter(
            path_imgrec=self.linked + '.rec', path_imgidx=self.linked + '.idx', resize=self.images.val_resize,
            inter_method=1, rand_crop=False, rand_mirror=False, shuffle=False, round_batch=True,
            num_parts=self.num_workers, part_index=self.rank, **self._common(self.images.shape_of(training=False)))
        first = self.part.start
        for index, batch in enumerate(iterator):
            if index == self.num_batches:
                return
            labels = batch.label[0].asnumpy()[:self.batch_size - batch.pad]
            classes = self.dataset.num_classes
            bad = np.flatnonzero(~((labels >= 0) & (labels < classes) & (labels == np.floor(labels))))
            if len(bad):
                raise RecipeError(f'validation record {first + index * self.batch_size + int(bad[0])} of '
                                  f'{self.records.rec_path} has label {labels[bad[0]]:g}, outside '
                                  f'[0, {classes}): check --num-classes')
            if index >= start:
                images, labels = on_devices(batch.data[0], batch.label[0], self.images, self.contexts)
                positions = np.minimum(first + index * self.batch_size + np.arange(self.batch_size), self.part.stop - 1)
                yield mx.io.DataBatch(data=[images], label=[labels], pad=batch.pad, index=positions)


def measure_loader(args, loader, world, dllogger):
    """--test-io: read `loader` (--test-io-mode's, or None: there is no such data) alone for --num-epochs epochs
    (default 1) and report images/s."""
    if loader is None:
        raise RecipeError(f'--test-io-mode {args.test_io_mode} needs --data-{args.test_io_mode}')
    iterations = args.benchmark_iters or loader.num_batches
    rates = []
    for epoch in range(args.num_epochs):
        durations = []
        tick = time.time()
        for i, batch in enumerate(batches(loader, epoch, 0, iterations), 1):
            images = batch.data[0]
            for part in images if isinstance(images, list) else [images]:     # one slice per device, or one array
                part.wait_to_read()
            now = time.time()
            durations.append(now - tick)
            tick = now
            if i % args.disp_batches == 0:
                log.info('Batch [%d] Speed: %.1f samples/sec', i,
                         loader.batch_size * world.size / np.mean(durations[-args.disp_batches:]))
        rate = loader.batch_size * world.size / float(np.mean(logs.steady_durations(durations)))
        rates.append(rate)
        dllogger.log((epoch,), {f'{args.test_io_mode}.ips': rate})
    dllogger.log((), {f'{args.test_io_mode}.ips': float(np.mean(rates))})
