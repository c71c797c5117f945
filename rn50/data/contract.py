"""The loader contract every --data-backend follows (data.py's RecordLoader, dali.py's DaliLoader,
synthetic.py's SyntheticLoader), and the shapes, dtype and device placement of the batches they hand out. What
a loader is given are records: a Dataset (the files, the batch, the classes, the Images the network takes and
the training augmentation, rn50/data/preset.py's TrainingPreset), each built once from the flags by the composer:

    dataset = contract.Dataset.of(args)                     # train.get_loaders, once
    images = dataset.images                                 # Images: shapes, layout, dtype, normalisation, resize
    images.shape_of(training=False)                         # (C, H, W) of validation, pred and export

A loader has `batch_size` (per worker: --batch-size is the global batch), `num_batches` (per epoch, equal on
every worker for training, since Horovod needs equal step counts), `num_examples`, and `epoch(e, start)`,
a generator of `mx.io.DataBatch(data=[images], label=[labels], pad=p)` for epoch e from batch `start`.
Images are normalised ((x - mean) / std on the 0-255 scale), in --input-layout and the training dtype, with a
zero 4th channel when --image-shape has 4 channels. `pad` counts the filler samples at the end of a batch.
`images` and `labels` are each one array, or a list with one array per device of the worker (its contexts,
in that order, each on its device) when the loader placed the batch there itself: DALI on several GPUs, the
native and synthetic loaders on several devices. The step uses such slices as they are (`device_slices`);
one array is split over the devices.

Semantics shared by every backend:
* Training: random-resized-crop (area --min-random-area..--max-random-area, default 8-100%, aspect
  --min/max-random-aspect-ratio), horizontal flip, normalisation.
* Training order (dali-gpu, dali-cpu, mxnet): every epoch a fresh permutation of the whole .idx, a function
  of (--seed, epoch) alone (epoch_order), dealt round-robin over the global ranks (TrainingShard): sample j
  of batch i of rank r is order[(i * batch + j) * workers + r], so a global batch is a contiguous slice of
  the order. An epoch covers each of the --num-examples records once (default: every record of the .idx),
  plus filler (records from the start of the order, counted in `pad`) to give every worker the same number
  of full batches.
* Validation: shorter side resized to --data-val-resize, center crop, file order, each record seen once
  over all workers, the last batch padded and its pad reported. A validation batch of the real backends also
  carries `index`, the position of each of its images in the .idx (the review gathers every image's outcome
  by it, rn50/review/outcomes.py).
* Determinism and seeking: the batches of (seed, epoch, rank, workers) are fixed, records and augmentation,
  and `epoch(e, k)` starts at batch k without reading or decoding batches 0..k-1 (DALI draws its
  augmentation per batch; the native loader feeds ImageRecordIter chunks of CHUNK_IMAGES images, so it
  decodes at most the chunk's earlier batches in vain).
* Bad data fails with a RecipeError naming the file and record: a missing file, an .idx that does not match
  its .rec, or a label outside [0, --num-classes). Start-up parses the .idx and checks STARTUP_CHECKS
  records (all of them up to 256); every other record is checked when its batch is read, before the batch
  leaves the loader (start-up: well under a second on a 1.28 M-record index).
* Synthetic data has the real path's shapes and dtypes, a validation set of ImageNet's share of the epoch,
  and random validation labels (accuracy stays at chance: it measures speed, not learning).
"""
import dataclasses

import mxnet as mx
import numpy as np

from rn50.data.preset import TrainingPreset
from rn50.errors import RecipeError

IMAGENET_TRAIN_SIZE = 1281167
IMAGENET_VAL_SIZE = 50000


def training_dtype(dtype, amp):
    """The dtype the network consumes (`dtype`: --dtype, `amp`: --amp): float16 only for float16 without AMP."""
    return 'float16' if dtype == 'float16' and not amp else 'float32'


def interpolation(given, backend):
    """The validation resize's interpolation, a property of the run: the weights' run's in val, pred and export
    (`given`, resolve.py's val_interpolation from trained_settings), else the `backend`'s: 'linear' (OpenCV's
    INTER_LINEAR, as ImageRecordIter) for mxnet, 'linear-antialias' (fn.resize's default) for DALI (and synthetic
    data's runs)."""
    if given:
        return given
    return 'linear' if backend == 'mxnet' else 'linear-antialias'


@dataclasses.dataclass(frozen=True)
class Images:
    """What the network takes, as values (`of`: the resolved flags): `shape` (C, H, W) of training (--image-shape),
    `val_shape` (--val-image-shape, or None: the training size), the input `layout`, the `dtype` the network
    consumes (training_dtype), the normalisation (`mean`, `std` on the 0-255 scale), and the validation resize
    val, pred and export share (`val_resize`, --data-val-resize, and its `val_interpolation`)."""
    shape: tuple = (3, 224, 224)
    val_shape: tuple = None
    layout: str = 'NCHW'
    dtype: str = 'float32'
    mean: tuple = (123.68, 116.779, 103.939)
    std: tuple = (58.393, 57.12, 57.375)
    val_resize: int = 256
    val_interpolation: str = 'linear-antialias'

    @classmethod
    def of(cls, args):
        return cls(shape=tuple(args.image_shape),
                   val_shape=None if args.val_image_shape is None else tuple(args.val_image_shape),
                   layout=args.input_layout, dtype=training_dtype(args.dtype, args.amp), mean=tuple(args.rgb_mean),
                   std=tuple(args.rgb_std), val_resize=args.data_val_resize,
                   val_interpolation=interpolation(getattr(args, 'val_interpolation', None), args.data_backend))

    def shape_of(self, training):
        """(C, H, W) of the images of training, or of validation, pred and export (--val-image-shape's size, else
        --image-shape's; the channels always --image-shape's, which the runner makes 4 for float16 on GPUs)."""
        if training or self.val_shape is None:
            return tuple(self.shape)
        return (self.shape[0],) + tuple(self.val_shape[1:])


@dataclasses.dataclass(frozen=True)
class Dataset:
    """What a loader reads and hands out, as values (`of`): the training and validation files (`train`, `val`:
    (.rec, .idx), the .rec None where not given), the global `batch_size`, `num_classes`, `num_examples` of a
    training epoch (--num-examples; None: every record), the `images` the network takes (Images) and the training
    augmentation (`preset`, a TrainingPreset). A part of the run that reads otherwise (validation's batch on a
    small set, INT8 calibration on the training images) takes a dataclasses.replace'd copy."""
    train: tuple = (None, '')
    val: tuple = (None, '')
    batch_size: int = 192
    num_classes: int = 1000
    num_examples: int = None
    images: Images = Images()
    preset: TrainingPreset = TrainingPreset()

    # The flags a resumed run must keep as its state recorded them (fit.RESUMED_SETTINGS): the training data (as
    # an absolute path; none for synthetic data, resume.run_settings); the batch may change (Saver.resume).
    RESUMED = ('data_train',)

    @classmethod
    def of(cls, args):
        return cls(train=(args.data_train, args.data_train_idx), val=(args.data_val, args.data_val_idx),
                   batch_size=args.batch_size, num_classes=args.num_classes, num_examples=args.num_examples,
                   images=Images.of(args), preset=TrainingPreset.of(args))


def per_worker_batch(batch_size, num_workers):
    """The batch of each of `num_workers` workers of the global `batch_size` (--batch-size)."""
    if batch_size % num_workers:
        raise RecipeError(f'--batch-size {batch_size} is not divisible by the {num_workers} workers')
    return batch_size // num_workers


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


def device_slices(array, contexts):
    """A batch's images or labels as one slice per device of `contexts`, each on its device: the loader's
    own per-device list as it is (no copy, no join), else the one array split evenly."""
    if isinstance(array, list):
        return array
    return mx.gluon.utils.split_and_load(array, contexts, even_split=True)


def joined(array):
    """A batch's images or labels as one array (per-device slices joined on the first one's device)."""
    if not isinstance(array, list):
        return array
    return mx.nd.concat(*[part.as_in_context(array[0].context) for part in array], dim=0)


def on_devices(images, labels, spec, contexts):
    """(images, labels) of a host batch (NCHW float32 normalised images) on the worker's devices (`contexts`),
    as a loader hands them out: each device's slice is copied there first, then given the network's channels,
    layout and dtype there (finish_images; `spec`: an Images). On a GPU that work leaves the host's threads: the
    float16 cast of 192 images took 87 ms on the CPU with the runner's OMP_NUM_THREADS=1, longer than a 64 ms
    step. One array each for one device, else a list of one array per device."""
    image_parts = [finish_images(part, spec) for part in device_slices(images, contexts)]
    label_parts = device_slices(labels, contexts)
    if len(contexts) == 1:
        return image_parts[0], label_parts[0]
    return image_parts, label_parts


def finish_images(images, spec):
    """NCHW float32 normalised images -> the layout, channel count and dtype the network takes (`spec`: an
    Images)."""
    if spec.shape[0] == 4:
        images = mx.nd.concat(images, mx.nd.zeros_like(images[:, :1]), dim=1)
    if spec.layout == 'NHWC':
        images = mx.nd.transpose(images, axes=(0, 2, 3, 1))
    dtype = spec.dtype
    return images if images.dtype == np.dtype(dtype) else images.astype(dtype)
