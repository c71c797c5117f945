"""DALI loaders (--data-backend dali-gpu / dali-cpu) with the loader contract of data.py.

    python train.py --data-backend dali-cpu --data-train data/train.rec --data-train-idx data/train.idx ...
    python train.py --data-backend dali-cpu --test-io --data-train ...     # DALI throughput alone

Order: the pipeline is fed by fn.external_source, batch by batch, from records.TrainingShard (training: a fresh
permutation of the whole file every epoch, a function of (--seed, epoch), dealt round-robin over the global
ranks) or records.SequentialShard (validation: file order). DALI's own RecordIO reader is not used: it sticks
to one shard and shuffles within a buffer of at most a few thousand records, so consecutive epochs came out
in nearly the same order (docs/data.md, "Training order"), and it cannot start at batch k without decoding batches
0..k-1. A background thread per pipeline reads the encoded images of the next batches (records.RecordFile:
views into an mmap of the .rec, or positioned reads with --dali-dont-use-mmap), checking each record's
header and label, and draws the batch's augmentation.

Augmentation: the random-resized-crop windows (rn50/data/crop_windows.py) and mirror flags are drawn in numpy
from (--seed, epoch, rank, batch), with the rule of DALI's random crop (area uniform in --min/max-random-area,
aspect ratio log-uniform in the aspect range, 10 attempts, then the whole image clamped to the range and the
largest area, each window placed at random), from the image size read from the JPEG header. So batch k of an epoch
is the same whether the epoch started at 0 or was resumed at k, and the pipeline can be kept: it is built
once per loader and reset between epochs, not rebuilt. With --dali-fuse-decoder 1 only the crop window is
decoded (decoders.image_slice); then resize to the image shape, mirror, normalisation and
layout/dtype/4th-channel padding in one crop_mirror_normalize.
Validation (validation_input; pred's too, PredictionImages, and the model.dali of export --triton,
serialize_preprocessing): decode, shorter side to --data-val-resize with
ImageRecordIter's geometry and the run's interpolation (contract.interpolation), center crop. dali-gpu decodes
with nvJPEG ("mixed"),
one pipeline per device of --gpus (each decodes its slice of the worker's batch, which stays on that device:
a batch of several devices is a list of slices); dali-cpu runs a CPU-only pipeline (device_id=None) and
needs no GPU at all. Outputs are copied into MXNet arrays synchronously (copy_output).
"""
import collections
import ctypes
import dataclasses
import logging
import re
import weakref
from concurrent.futures import ThreadPoolExecutor

import mxnet as mx
import numpy as np

from rn50 import flags
from rn50.data import augment
from rn50.data import contract
from rn50.data import crop_windows
from rn50.data import records
from rn50.data import validation_resize
from rn50.errors import RecipeError

log = logging.getLogger(__name__)

AUGMENT_STREAM = 0xa09   # keys the augmentation's random stream apart from the order's
READ_AHEAD = 2           # batches read ahead of the pipeline's own prefetch, per pipeline


def add_dali_args(parser):
    group = parser.add_argument_group('DALI data backend', 'entire group applies only to dali data backend')
    group.add_argument('--dali-separ-val', action='store_true',
                       help='each process will perform independent validation on whole val-set')
    group.add_argument('--dali-threads', type=flags.integer(minimum=1), default=6,
                       help='number of threads per GPU for DALI')
    group.add_argument('--dali-validation-threads', type=flags.integer(minimum=1), default=10,
                       help='number of threads per GPU for DALI for validation')
    group.add_argument('--dali-prefetch-queue', type=flags.integer(minimum=1), default=5,
                       help='DALI prefetch queue depth')
    group.add_argument('--dali-nvjpeg-memory-padding', type=flags.integer(minimum=0), default=64,
                       help='Memory padding value for nvJPEG (in MB)')
    group.add_argument('--dali-fuse-decoder', type=int, default=1, choices=(0, 1),
                       help='0 or 1 whether to fuse decoder or not')
    group.add_argument('--dali-nvjpeg-width-hint', type=flags.integer(minimum=1), default=5980,
                       help='Width hint value for nvJPEG (in pixels)')
    group.add_argument('--dali-nvjpeg-height-hint', type=flags.integer(minimum=1), default=6430,
                       help='Height hint value for nvJPEG (in pixels)')
    group.add_argument('--dali-dont-use-mmap', action='store_true',
                       help='Use plain I/O instead of MMAP for datasets (e.g. on network filesystems)')
    return group


@dataclasses.dataclass(frozen=True)
class Options:
    """The DALI backends' own settings (`of`: the flags): --dali-threads and --dali-validation-threads, the
    prefetch queue, nvJPEG's memory padding (MB) and size hints, the fused decoder, mmap, each worker validating
    the whole set (--dali-separ-val), and the GPU backend (dali-gpu) or the CPU one."""
    threads: int = 6
    validation_threads: int = 10
    prefetch_queue: int = 5
    nvjpeg_memory_padding: int = 64
    nvjpeg_width_hint: int = 5980
    nvjpeg_height_hint: int = 6430
    fuse_decoder: int = 1
    use_mmap: bool = True
    separate_validation: bool = False
    on_gpu: bool = False

    @classmethod
    def of(cls, args):
        return cls(threads=args.dali_threads, validation_threads=args.dali_validation_threads,
                   prefetch_queue=args.dali_prefetch_queue, nvjpeg_memory_padding=args.dali_nvjpeg_memory_padding,
                   nvjpeg_width_hint=args.dali_nvjpeg_width_hint, nvjpeg_height_hint=args.dali_nvjpeg_height_hint,
                   fuse_decoder=args.dali_fuse_decoder, use_mmap=not args.dali_dont_use_mmap,
                   separate_validation=args.dali_separ_val, on_gpu=args.data_backend == 'dali-gpu')


# ----------------------------------------------------------------------------------------------------------
# The pipeline's source


class Feed:
    """The external source of one pipeline: the batches of the current plan, read ahead in a thread.

    DALI calls it (from pipe.run(), in the consumer's thread) up to --dali-prefetch-queue batches ahead of
    the batch being consumed; it serves the plan in order and raises StopIteration at its end, which ends
    the pipeline's epoch. `in_flight` holds what each batch handed to DALI but not yet consumed needs on the
    way out (labels, pad, record indices).

    It holds its loader weakly. The loader owns the pipelines and each pipeline holds its feed: a strong
    reference back would close a cycle that only Python's cyclic collector frees, at an arbitrary later moment
    and in whatever state, DALI's threads prefetching and (dali-gpu) its decode buffers held until then. Held
    weakly, a dropped loader shuts its pipelines down at once (DALI's Pipeline.__del__)."""

    def __init__(self, loader, device, devices):
        self.loader, self.device, self.devices = weakref.proxy(loader), device, devices
        self.pool = ThreadPoolExecutor(1, thread_name_prefix='dali-feed')
        self.plan, self.reading, self.in_flight = collections.deque(), collections.deque(), collections.deque()

    def start(self, epoch, batches):
        self.plan = collections.deque((epoch, index) for index in batches)

    def stop(self):
        self.plan.clear()
        self.reading.clear()    # any read still running finishes harmlessly

    def __call__(self):
        while len(self.reading) < READ_AHEAD and self.plan:
            self.reading.append(self.pool.submit(self.loader.read_batch, *self.plan.popleft(), self.device,
                                                 self.devices))
        if not self.reading:
            raise StopIteration
        inputs, info = self.reading.popleft().result()
        self.in_flight.append(info)
        return inputs


def copy_output(output, array, on_gpu):
    """Copy a pipeline output (a DALI Tensor) into the NDArray `array`; the copy is complete on return.

    DALI's feed_ndarray copies a GPU output on a DALI stream without waiting (non_blocking=True), while
    MXNet, whose engine knows nothing of that copy, reads the array later on its own stream: nothing orders
    the two (DALI's own MXNet iterator has the same gap). MXNet 1.9.1 exposes neither its stream nor an event
    to wait on from Python, so this copy is synchronous instead: copy_to_external(non_blocking=False) waits
    for it on DALI's stream (one device-to-device copy of a batch slice). `array` is new (mx.nd.empty), so
    no MXNet operation is pending on it. A CPU output is a plain memcpy, complete on return anyway."""
    if output.shape() != list(array.shape):
        raise ValueError(f'DALI output of shape {output.shape()} for an array of shape {array.shape}')
    pointer = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    if on_gpu:
        output.copy_to_external(pointer, cuda_stream=None, non_blocking=False)
    else:
        output.copy_to_external(pointer)


def pipeline_failure(records_file, feed, error, epoch, index):
    """The RecipeError message for a DALI pipeline error: a decoder's names the undecodable record among those
    in flight; any other (an augmentation, say) is not the data's fault, and says what DALI said."""
    if 'operator decoders__' in str(error):
        return records.undecodable_message(records_file, np.concatenate([info[2] for info in feed.in_flight]), error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip() and not line.startswith(
        ('[frame', 'Stacktrace', 'Critical error in pipeline', 'Current pipeline object'))]
    return f'the DALI pipeline failed at batch {index} of epoch {epoch}: {" ".join(lines[:2])[:400]}'


def loader_graph(loader, device):
    """What pipeline_def takes: a function (DALI's conditionals cannot convert a bound method)."""
    return loader.graph(device)


def validation_input(jpegs, spec, decoder):
    """The validation graph, from encoded images to the network's input (pred's too: PredictionImages):
    decoded; resized and centre-cropped by the one validation geometry (validation_resize.resized_size and
    crop_start, on the encoded size) with the run's interpolation (its val_interpolation: linear, antialiased when
    shrinking or not); normalised into the layout, dtype and channels of the training batches (`spec`: the run's
    contract.Images)."""
    from nvidia.dali import fn, math, types
    channels, height, width = spec.shape_of(training=False)
    encoded = fn.peek_image_shape(jpegs, dtype=types.INT32)   # (height, width, channels), as decoded (no EXIF turn)
    rows, columns = validation_resize.resized_size(encoded[0], encoded[1], spec.val_resize, math.min)
    images = fn.resize(fn.decoders.image(jpegs, **decoder), resize_y=fn.cast(rows, dtype=types.FLOAT),
                       resize_x=fn.cast(columns, dtype=types.FLOAT), interp_type=types.INTERP_LINEAR,
                       antialias=spec.val_interpolation == 'linear-antialias')
    images = fn.slice(images, start=fn.stack(validation_resize.crop_start(rows, height),
                                             validation_resize.crop_start(columns, width)),
                      shape=[height, width], axis_names='HW')
    dtype = types.FLOAT16 if spec.dtype == 'float16' else types.FLOAT
    return fn.crop_mirror_normalize(images, mean=list(spec.mean), std=list(spec.std), dtype=dtype,
                                    pad_output=channels == 4,
                                    output_layout='CHW' if spec.layout == 'NCHW' else 'HWC')


def encoded_images_pipeline(spec, input_name, batch_size, num_threads, **options):
    """A CPU-only pipeline (device_id None) of the validation graph from encoded image files: the external
    source `input_name` (one uint8 array of the file's bytes per image) through validation_input with the CPU
    decoder; `options` go to the pipeline (pred's runs one image at a time, synchronously)."""
    from nvidia.dali import fn, pipeline_def, types

    def graph():
        jpegs = fn.external_source(name=input_name, dtype=types.UINT8, ndim=1)
        return validation_input(jpegs, spec, dict(device='cpu', output_type=types.RGB))
    return pipeline_def(graph, batch_size=batch_size, num_threads=num_threads, device_id=None, **options)()


def serialize_preprocessing(spec, threads, path, input_name, max_batch_size):
    """Write the validation graph from encoded images to the input of export's portable network (float32, 3
    channels, --input-layout) as a serialized DALI pipeline at `path`: the model.dali that Triton's DALI backend
    runs, with the external source `input_name`, batches of up to `max_batch_size` images and
    --dali-validation-threads threads, on the CPU (Triton's DALI backend runs a CPU-only pipeline on CPU instances).
    The composer hands `functools.partial(serialize_preprocessing, images, threads)` to export (`spec`: the run's
    contract.Images; `threads`: --dali-validation-threads)."""
    from nvidia.dali import types
    portable = dataclasses.replace(spec, shape=(3,) + tuple(spec.shape[1:]), dtype='float32')
    pipe = encoded_images_pipeline(portable, input_name, max_batch_size, threads,
                                   output_dtype=types.FLOAT, output_ndim=3)
    pipe.serialize(filename=path)


class PredictionImages:
    """pred's input for a run that validates with DALI: each file through validation_input on the CPU (one
    pipeline of batch 1, fed file by file), the very graph of validation."""

    def __init__(self, spec):
        """`spec`: the run's contract.Images."""
        self.spec, self.pipe = spec, None

    def build(self):
        pipe = encoded_images_pipeline(self.spec, 'encoded', 1, 1, prefetch_queue_depth=1, exec_pipelined=False,
                                       exec_async=False)
        pipe.build()
        return pipe

    def load(self, path):
        """The image file at `path` as a batch of 1 (an NDArray on the host); RecipeError when it cannot be read
        (after which the pipeline, which a failure leaves unusable, is built again for the next file)."""
        try:
            with open(path, 'rb') as f:
                encoded = f.read()
        except OSError as e:
            raise RecipeError(f'cannot read image {path}: {e.strerror or e}') from e
        return self.prepare(encoded, path)

    def prepare(self, encoded, name):
        """load's preprocessing of an encoded image (`encoded`: its bytes; `name`: what an error calls it)."""
        try:
            self.pipe = self.pipe or self.build()
            self.pipe.feed_input('encoded', [np.frombuffer(encoded, dtype=np.uint8)])
            (images,) = self.pipe.run()
        except RuntimeError as e:
            self.pipe = None
            reason = [line.strip() for line in str(e).splitlines() if line.strip() and not line.startswith(
                ('[frame', 'Stacktrace', 'Critical error in pipeline', 'Current pipeline object'))]
            reason = re.sub(r'\[/[^]]*\] ?', '', ' '.join(reason[:2]))[:300] or type(e).__name__
            raise RecipeError(f'cannot read image {name}: {reason}') from e
        return mx.nd.array(np.asarray(images.as_tensor()), dtype=self.spec.dtype)


class DaliLoader:
    """One worker's DALI pipelines (one per device for dali-gpu) for training or validation data.

    `contexts`: the worker's devices, where the outputs go, one pipeline each (dali-cpu on a GPU worker keeps
    its batches on the host); with several, a batch holds one slice per device (rn50/data/contract.py), each
    decoded and kept on its device; tests pass several CPU contexts to run that path with dali-cpu. `seed`:
    the run's, from which the order and the augmentation are drawn."""

    def __init__(self, dataset, options, rank, num_workers, training, contexts=(mx.cpu(),), seed=0):
        """`dataset`: a contract.Dataset (files, batch, classes, Images, training preset); `options`: Options."""
        self.options, self.images, self.preset = options, dataset.images, dataset.preset
        self.training, self.seed = training, seed
        self.batch_size = contract.per_worker_batch(dataset.batch_size, num_workers)
        what = 'training' if training else 'validation'
        rec, idx = dataset.train if training else dataset.val
        self.records = records.RecordFile(rec, idx, dataset.num_classes, what, use_mmap=options.use_mmap)
        if not training and options.separate_validation:
            rank, num_workers = 0, 1   # every worker validates the whole set
        self.rank, self.num_workers = rank, num_workers
        if training:
            self.num_examples = dataset.num_examples or len(self.records)
            self.shard = records.TrainingShard(len(self.records), self.num_examples, rank, num_workers,
                                               self.batch_size, seed, self.preset.repeats)
        else:
            self.num_examples = len(self.records)
            self.shard = records.SequentialShard(self.num_examples, rank, num_workers, self.batch_size)
            log.info('Validation with DALI: %s', validation_resize.describe_val_resize(self.images))
        self.num_batches = self.shard.num_batches
        self.real_samples = self.shard.real_samples
        self.on_gpu = options.on_gpu
        on_cpus = all(context.device_type == 'cpu' for context in contexts)
        self.contexts = list(contexts) if self.on_gpu or on_cpus else [mx.cpu()]   # dali-cpu: batches on the host
        if self.batch_size % len(self.contexts):
            raise RecipeError(f'the per-worker batch {self.batch_size} is not divisible by the '
                              f'{len(self.contexts)} devices')
        self.feeds = [Feed(self, d, len(self.contexts)) for d in range(len(self.contexts))]
        self.policy = augment.AutoAugmentPolicy(self.preset.auto_augment) \
            if training and self.preset.auto_augment else None
        # Built now, not at the first epoch: a validation pipeline first built after a training epoch (decode
        # buffers, nvJPEG padding, prefetched batches: 0.5-1.5 GB on a GPU) would meet MXNet's memory pool at
        # its training peak, an out-of-memory about an epoch in on 16 GB cards.
        self.pipes = [self.pipeline(d) for d in range(len(self.contexts))]
        self.running = False     # a pipeline epoch is under way (possibly abandoned by the consumer)

    @classmethod
    def of(cls, args, rank, num_workers, training, contexts=(mx.cpu(),), seed=0):
        """The loader of the resolved flags `args` (its records made here)."""
        return cls(contract.Dataset.of(args), Options.of(args), rank, num_workers, training, contexts, seed)

    def read_batch(self, epoch, index, device, devices):
        """The external-source inputs of this device's slice of batch `index`, and what the consumer needs
        with its output. Runs in the feed's thread."""
        indices, pad = self.shard.batch(epoch, index)
        part = len(indices) // devices
        indices = indices[device * part:(device + 1) * part]
        payloads, labels = self.records.read(indices)
        jpegs = [np.frombuffer(p, dtype=np.uint8) for p in payloads]
        inputs = [jpegs]
        if self.training:
            preset = self.preset
            sizes = np.array([crop_windows.image_size(p) or (1000, 1000) for p in payloads], dtype=np.float64)
            rng = np.random.default_rng([self.seed, epoch, self.rank, index, device, AUGMENT_STREAM])
            anchors, shapes = crop_windows.random_crops(sizes, rng, preset.area, preset.aspect_ratio)
            mirror = rng.integers(0, 2, len(indices), dtype=np.int32) if preset.mirror else \
                np.zeros(len(indices), np.int32)
            inputs += [anchors, shapes, mirror] + self.extra_draws(epoch, index, device, len(indices))
        return inputs, (labels, pad, indices)

    def extra_draws(self, epoch, index, device, count):
        """The external-source inputs of --progressive-size, --auto-augment and --random-erase for `count`
        images: the epoch's (height, width) (resolution.py); operations, bins and signs (augment.py); the
        erased boxes' anchors and shapes, and their noise in pixel mode."""
        preset, inputs = self.preset, []
        keys = [self.seed, epoch, self.rank, index, device]
        channels, height, width = preset.training_shape(epoch)
        if preset.progressive is not None:
            inputs.append(np.tile(np.array([height, width], np.float32), (count, 1)))
        if self.policy is not None:
            inputs += self.policy.draw(np.random.default_rng(keys + [augment.AUTO_AUGMENT_STREAM]), count)
        if preset.random_erase:
            rng = np.random.default_rng(keys + [augment.ERASE_STREAM])
            anchors, shapes = augment.erase_boxes(rng, count, height, width, preset.random_erase)
            inputs += [anchors, shapes]
            if preset.erase_mode == 'pixel':
                inputs.append(augment.erase_noise(rng, shapes, channels))
        return inputs

    def training_inputs(self, device):
        """The DataNodes of read_batch's training inputs: jpegs, anchors, shapes, mirror, then
        extra_draws' (the size; the auto-augment draws as one list; the erasing's; None for what is off)."""
        from nvidia.dali import fn, types
        preset = self.preset
        kinds = [(types.UINT8, 1), (types.FLOAT, 1), (types.FLOAT, 1), (types.INT32, 0)]
        if preset.progressive is not None:
            kinds.append((types.FLOAT, 1))
        if self.policy is not None:
            kinds += [(types.INT32, 1)] * 3
        if preset.random_erase:
            kinds += [(types.FLOAT, 1)] * 2
            if preset.erase_mode == 'pixel':
                kinds.append((types.FLOAT, 3))
        nodes = list(fn.external_source(source=self.feeds[device], num_outputs=len(kinds), batch=True,
                                        dtype=[kind for kind, _ in kinds], ndim=[ndim for _, ndim in kinds]))
        jpegs, anchors, shapes, mirror = nodes[:4]
        rest = nodes[4:]
        size = rest.pop(0) if preset.progressive is not None else None
        draws = None
        if self.policy is not None:
            draws, rest = rest[:3], rest[3:]
        erase = rest + [None] * (3 - len(rest)) if preset.random_erase else None
        return jpegs, anchors, shapes, mirror, size, draws, erase

    def pipeline(self, device):
        from nvidia.dali import pipeline_def
        options = self.options
        threads = options.threads if self.training else options.validation_threads
        # Conditional execution (DALI's `select` splits a batch by each image's operation) only when needed, and
        # then only asked for: a DALI before 1.23 has no such keyword (augment.check_dali stops --auto-augment
        # there), and runs everything else.
        build = pipeline_def(loader_graph, enable_conditionals=True) if self.policy is not None else \
            pipeline_def(loader_graph)
        pipe = build(self, device, batch_size=self.batch_size // len(self.contexts), num_threads=threads,
                     seed=records.epoch_seed(self.seed, self.rank, device),
                     device_id=self.contexts[device].device_id if self.on_gpu else None,
                     prefetch_queue_depth=options.prefetch_queue)
        pipe.build()
        return pipe

    def graph(self, device):
        """The DALI graph of this loader's pipeline for `device`: its output, the batch of images."""
        from nvidia.dali import fn, types
        options, spec = self.options, self.images
        channels, height, width = spec.shape_of(self.training)
        decoder = dict(device='mixed' if self.on_gpu else 'cpu', output_type=types.RGB)
        if self.on_gpu:
            padding = options.nvjpeg_memory_padding * 1024 * 1024
            decoder.update(device_memory_padding=padding, host_memory_padding=padding,
                           preallocate_width_hint=options.nvjpeg_width_hint,
                           preallocate_height_hint=options.nvjpeg_height_hint)
        erase, crop = None, {}
        if self.training:
            jpegs, anchors, shapes, mirror, size, draws, erase = self.training_inputs(device)
            if options.fuse_decoder:
                images = fn.decoders.image_slice(jpegs, anchors, shapes, **decoder)
            else:
                images = fn.slice(fn.decoders.image(jpegs, **decoder), anchors, shapes)
            # resized to exactly the training size (the epoch's with --progressive-size): nothing to crop
            size = (height, width) if size is None else size
            images = fn.resize(images, resize_x=size[1], resize_y=size[0])
            if draws is not None:
                images = self.policy.apply(images, *draws, size)
        else:
            jpegs = fn.external_source(source=self.feeds[device], num_outputs=1, batch=True,
                                       dtype=[types.UINT8], ndim=[1])[0]
            return validation_input(jpegs, spec, decoder)
        channels_first = spec.layout == 'NCHW'
        dtype = types.FLOAT16 if spec.dtype == 'float16' else types.FLOAT
        # Erasing gets float32 on every device (DALI's GPU erase has no float16, its arithmetic neither), then the
        # cast: dali-cpu runs the very graph of dali-gpu.
        normalised = dtype if erase is None else types.FLOAT
        images = fn.crop_mirror_normalize(
            images, mirror=mirror, mean=list(spec.mean), std=list(spec.std), **crop,
            dtype=normalised, pad_output=channels == 4,
            output_layout='CHW' if channels_first and erase is None else 'HWC')
        if erase is not None:     # erased after normalisation, as torchvision and timm do, in HWC
            anchors, shapes, noise = erase
            if noise is not None and self.on_gpu:
                noise = noise.gpu()     # an external source's output is on the host; the images are not
            images = augment.apply_erase(images, anchors, shapes, noise, size)
            if dtype != normalised:
                images = fn.cast(images, dtype=dtype)
            if channels_first:
                images = fn.transpose(images, perm=[2, 0, 1])
        return images

    def _settle(self):
        """Bring the pipelines to the end of their epoch and reset them: after a complete epoch that is one
        StopIteration; after an abandoned one (the consumer stopped early) it also discards the at most
        --dali-prefetch-queue batches already handed to DALI."""
        if not self.running:
            return
        for feed, pipe in zip(self.feeds, self.pipes):
            feed.stop()
            while True:
                try:
                    pipe.run()
                except StopIteration:
                    break
                except RuntimeError:    # a decoding error in a batch nobody will use
                    continue
                finally:
                    if feed.in_flight:
                        feed.in_flight.popleft()
            feed.in_flight.clear()
            pipe.reset()
        self.running = False

    def epoch(self, epoch, start=0):
        self._settle()
        if start >= self.num_batches:
            return
        for feed in self.feeds:
            feed.start(epoch, range(start, self.num_batches))
        self.running = True
        dtype = self.images.dtype
        for index in range(start, self.num_batches):
            parts, labels, positions = [], [], []
            for feed, pipe, context in zip(self.feeds, self.pipes, self.contexts):
                try:
                    (images,) = pipe.run()
                except RuntimeError as e:
                    raise RecipeError(pipeline_failure(self.records, feed, e, epoch, index)) from e
                part_labels, pad, part_positions = feed.in_flight.popleft()
                positions.append(part_positions)
                images = images.as_tensor()
                array = mx.nd.empty(images.shape(), ctx=context, dtype=dtype)
                copy_output(images, array, self.on_gpu)
                parts.append(array)
                labels.append(mx.nd.array(part_labels, ctx=context, dtype='float32'))
            # Several devices: each keeps its slice (the step uses them as they are, no round trip through
            # the first device).
            if len(parts) == 1:
                parts, labels = parts[0], labels[0]
            yield mx.io.DataBatch(data=[parts], label=[labels], pad=pad, index=np.concatenate(positions))
