"""The float16 machinery of the recipe on the CPU (a twin of the GPU default, --dtype float16), also run as
a Horovod worker script by tests/test_fit.py:

    horovodrun -np 2 --gloo python tests/float16_twin.py OUT.json

Each of 2 workers trains Float16Net with the recipe's own TrainingStep in float16 (float32 master weights,
dynamic loss scaling), from weights initialised differently per worker and then broadcast from rank 0; at
step 1 only rank 1's batch holds an inf, so after the all-reduce both must skip that step. Rank 0 writes
every worker's loss scale, skip count, gradient pre-division factor, gradient groups and weights to OUT.json.
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rn50.training import losses  # noqa: E402
from rn50.world import devices, workers  # noqa: E402
from conftest import resolved  # noqa: E402
from rn50.training.step import StepSettings, TrainingStep  # noqa: E402


class Float16Net(gluon.HybridBlock):
    """logits = mean over pixels of BatchNorm(x), times a (classes, channels) matrix: only operators MXNet
    runs in float16 on a CPU (it has no float16 convolution or dense there). After cast('float16') the
    matrix is float16 and the batchnorm parameters stay float32, as in the recipe's float16 ResNet."""

    def __init__(self, classes=3, channels=4, batchnorm=True):
        super().__init__()
        with self.name_scope():
            self.bn = gluon.nn.BatchNorm(in_channels=channels) if batchnorm else None
            self.weight = self.params.get('weight', shape=(classes, channels), init=mx.init.Normal(0.5))

    def hybrid_forward(self, F, x, weight):
        features = F.mean(self.bn(x) if self.bn is not None else x, axis=(2, 3))
        return F.sum(F.broadcast_mul(features.expand_dims(1), weight.expand_dims(0)), axis=2).astype('float32')


def step_for(net, dtype='float32', contexts=(mx.cpu(),), batch=8, kv_store='device', extra=(), kind='cpu',
             average=None):
    """The recipe's TrainingStep for `net` (initialised here, cast to `dtype`) on `contexts`, devices of `kind`
    ('gpu': the step of a GPU worker, on CPU contexts); `extra`: more train.py flags; `average(net)`: the step's
    weight average of the initialised net (an ema.WeightAverage), or None."""
    args = resolved(['--batch-size', str(batch), '--lr', '0.1', '--wd', '0', '--label-smoothing', '0.1',
                     '--num-classes', '3', '--seed', '1', '--kv-store', kv_store] + list(extra), dtype=dtype)
    net.initialize(ctx=list(contexts))
    if dtype == 'float16':
        net.cast('float16')
    world = workers.World(workers.Communicator.start(kv_store), devices.Devices(tuple(contexts), kind))
    return TrainingStep(net, world, StepSettings.of(args), seed=1, average=average and average(net))


def batch_of(values, labels, dtype='float32'):
    return mx.io.DataBatch(data=[mx.nd.array(values, dtype=dtype)], label=[mx.nd.array(labels)])




def main(output):
    mx.random.seed(int(os.environ.get('HOROVOD_RANK', '0')))   # other weights per worker until the broadcast
    step = step_for(Float16Net(), 'float16', kv_store='horovod', batch=16)
    world = step.world
    world.comm.broadcast_parameters(step.net.collect_params())
    step.loss_scale = losses.DynamicLossScale(scale=8.0, interval=2)
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(16, 4, 2, 2)), rng.integers(0, 3, 16)
    mine = slice(8 * world.rank, 8 * world.rank + 8)
    for iteration in range(3):
        batch = images[mine].copy()
        if iteration == 1 and world.rank == 1:
            batch[0, 0, 0, 0] = np.inf
        step.run(batch_of(batch, labels[mine], 'float16'), 0, iteration, 0.1)
    weight = step.net.weight.data().asnumpy().astype(np.float32).ravel()
    row = np.concatenate([[step.loss_scale.scale, step.loss_scale.skipped, step.loss_scale.clean_steps,
                           step.gluon_trainer._gradient_predivide_factor, step.gluon_trainer._num_groups], weight])
    rows = world.comm.gather(row)
    if world.rank == 0:
        with open(output, 'w') as f:
            json.dump([{'scale': r[0], 'skipped': r[1], 'clean_steps': r[2], 'predivide': r[3], 'groups': r[4],
                        'weight': r[5:]} for r in rows.tolist()], f)


if __name__ == '__main__':
    main(sys.argv[1])
