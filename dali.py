"""DALI loaders (--data-backend dali-gpu / dali-cpu) with the loader contract of data.py.

    python train.py --data-backend dali-cpu --data-train data/train.rec --data-train-idx data/train.idx ...
    python train.py --data-backend dali-cpu --test-io --data-train ...     # DALI throughput alone

Training: DALI's RecordIO reader (sharded by global rank, shuffled), decoding fused with the random crop
(--dali-fuse-decoder 1: only the crop region is decoded) or full decode then random-resized-crop, resize to
the image shape, random mirror, normalisation and layout/dtype/4th-channel padding in one
crop_mirror_normalize. Validation: decode, shorter side to --data-val-resize, center crop. dali-gpu decodes
with nvJPEG ("mixed") and leaves batches on the GPU; dali-cpu runs a CPU-only pipeline (device_id=None) and
needs no GPU at all.

Each epoch gets a fresh pipeline seeded from (--seed, epoch, rank), so an epoch's batches are fixed and a
resumed run fast-forwards to the batch it stopped at (it decodes the skipped batches once). --seed thus
drives DALI too (the original pinned DALI's seed).
"""
import logging

import mxnet as mx
import numpy as np

import data
import flags
from errors import RecipeError

log = logging.getLogger(__name__)


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


class DaliLoader:
    """One worker's DALI pipeline for training or validation data."""

    def __init__(self, args, rank, num_workers, training):
        self.args, self.training = args, training
        self.batch_size = data.per_worker_batch(args, num_workers)
        what = 'training' if training else 'validation'
        rec, idx = (args.data_train, args.data_train_idx) if training else (args.data_val, args.data_val_idx)
        self.records = data.RecordFile(rec, idx, args.num_classes, what)
        if not training and args.dali_separ_val:
            rank, num_workers = 0, 1   # every worker validates the whole set
        self.rank, self.num_workers = rank, num_workers
        if training:
            self.num_examples = args.num_examples or len(self.records)
            self.num_batches = -(-(-(-self.num_examples // num_workers)) // self.batch_size)
        else:
            self.num_examples = len(self.records)
            self.num_batches = -(-data.shard_size(self.num_examples, rank, num_workers) // self.batch_size)
        self.real_samples = data.shard_size(self.num_examples, rank, num_workers)
        self.on_gpu = args.data_backend == 'dali-gpu'
        self.context = args.contexts[0] if self.on_gpu else mx.cpu()

    def pipeline(self, seed):
        from nvidia.dali import Pipeline, fn, types
        args = self.args
        height, width = args.image_shape[1:]
        threads = args.dali_threads if self.training else args.dali_validation_threads
        pipe = Pipeline(batch_size=self.batch_size, num_threads=threads, seed=seed,
                        device_id=self.context.device_id if self.on_gpu else None,
                        prefetch_queue_depth=args.dali_prefetch_queue)
        decoder = dict(device='mixed' if self.on_gpu else 'cpu', output_type=types.RGB)
        if self.on_gpu:
            padding = args.dali_nvjpeg_memory_padding * 1024 * 1024
            decoder.update(device_memory_padding=padding, host_memory_padding=padding,
                           preallocate_width_hint=args.dali_nvjpeg_width_hint,
                           preallocate_height_hint=args.dali_nvjpeg_height_hint)
        crop = dict(random_area=[args.min_random_area, args.max_random_area],
                    random_aspect_ratio=list(data.aspect_ratio_range(args)),
                    num_attempts=10)
        with pipe:
            jpegs, labels = fn.readers.mxnet(
                path=[self.records.rec_path], index_path=[self.records.idx_path], name='Reader',
                random_shuffle=self.training, shard_id=self.rank, num_shards=self.num_workers,
                stick_to_shard=True, pad_last_batch=True, dont_use_mmap=args.dali_dont_use_mmap,
                initial_fill=min(1024, max(self.real_samples, 1)))
            mirror = 0
            if self.training:
                if args.dali_fuse_decoder:
                    images = fn.decoders.image_random_crop(jpegs, **decoder, **crop)
                    images = fn.resize(images, resize_x=width, resize_y=height)
                else:
                    images = fn.decoders.image(jpegs, **decoder)
                    images = fn.random_resized_crop(images, size=(height, width), **crop)
                if args.random_mirror:
                    mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, **decoder)
                images = fn.resize(images, resize_shorter=args.data_val_resize)
            images = fn.crop_mirror_normalize(
                images, crop=(height, width), mirror=mirror, mean=list(args.rgb_mean), std=list(args.rgb_std),
                dtype=types.FLOAT16 if data.training_dtype(args) == 'float16' else types.FLOAT,
                output_layout='CHW' if args.input_layout == 'NCHW' else 'HWC',
                pad_output=args.image_shape[0] == 4)
            pipe.set_outputs(images, labels)
        pipe.build()
        return pipe

    def epoch(self, epoch, start=0):
        from nvidia.dali.plugin.mxnet import feed_ndarray
        pipe = self.pipeline(data.epoch_seed(self.args.seed, epoch, self.rank))
        for index in range(self.num_batches):
            try:
                images, labels = pipe.run()
            except RuntimeError as e:
                raise RecipeError(self._decode_error(e)) from e
            if index < start:
                continue
            images = images.as_tensor()
            batch = mx.nd.empty(images.shape(), ctx=self.context, dtype=data.training_dtype(self.args))
            feed_ndarray(images, batch)
            label_array = mx.nd.array(np.asarray(labels.as_tensor()).reshape(-1), dtype='float32')
            yield mx.io.DataBatch(data=[batch], label=[label_array],
                                  pad=data.filler_pad(index, self.batch_size, self.real_samples))
        del pipe

    def _decode_error(self, error):
        """DALI cannot skip an undecodable image: find the first bad record of this shard to name it."""
        first = (len(self.records) * self.rank) // self.num_workers
        return data.undecodable_message(self.records, first, self.real_samples, error)
