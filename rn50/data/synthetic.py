"""--data-backend synthetic: the loader contract of data.py with fixed random batches and no decoding, to
measure the training step alone.

    python train.py --data-backend synthetic --benchmark-iters 50 ...
    python benchmark.py --data-backend synthetic ...
"""
import mxnet as mx
import numpy as np

from rn50.data import contract
from rn50.data import records


class SyntheticLoader:
    """--data-backend synthetic: fixed random batches, no decoding (measures the training step alone).

    The training batch of worker r is slice r of one global batch drawn from the seed, so 1 and N workers
    see the same global batch. Validation images and labels are drawn independently: chance accuracy. The
    batch lives on the worker's devices (one slice per device), so a step copies nothing from the host
    (about 77 MB per 192 images on a GPU, which would distort the benchmark)."""

    def __init__(self, dataset, rank, num_workers, training, contexts=(mx.cpu(),), seed=0):
        """`dataset`: a contract.Dataset (its batch, class count, --num-examples and Images)."""
        self.batch_size = contract.per_worker_batch(dataset.batch_size, num_workers)
        train_examples = dataset.num_examples or contract.IMAGENET_TRAIN_SIZE
        if training:
            self.num_examples = train_examples
            self.num_batches = records.training_steps(self.num_examples, num_workers, self.batch_size)
        else:
            # ImageNet's validation/training ratio: 50,000 images for the default epoch of 1,281,167.
            self.num_examples = max(1, round(contract.IMAGENET_VAL_SIZE * train_examples / contract.IMAGENET_TRAIN_SIZE))
            self.num_batches = -(-records.shard_size(self.num_examples, rank, num_workers) // self.batch_size)
        first = rank * self.batch_size
        stream = 0 if training else 1
        shape = (3,) + dataset.images.shape_of(training)[1:]
        images = np.stack([np.random.default_rng([seed, stream, first + i]).uniform(-1, 1, shape)
                           for i in range(self.batch_size)]).astype(np.float32)
        labels = np.random.default_rng([seed, stream]).integers(
            0, dataset.num_classes, size=self.batch_size * num_workers)[first:first + self.batch_size]
        images, labels = contract.on_devices(mx.nd.array(images), mx.nd.array(labels, dtype='float32'), dataset.images,
                                             contexts)
        self.batch = mx.io.DataBatch(data=[images], label=[labels], pad=0)

    def epoch(self, epoch, start=0):
        for _ in range(start, self.num_batches):
            yield self.batch
