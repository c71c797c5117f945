"""workers.World's collectives on a stand-in for Horovod that plays two workers: broadcasts come out as rank
0's values and never go through Horovod's broadcast ops (a use-after-free in Horovod 0.28.1 crashed about one
start in 25; see World)."""
import mxnet as mx
import numpy as np
from mxnet import gluon

import workers


class TwoWorkerHorovod:
    """What Horovod's sums give rank 1 of 2 when rank 0 holds `rank0` (a list of arrays, in call order)."""

    Sum = 'sum'

    def __init__(self, rank0):
        self.rank0 = list(rank0)

    def allreduce(self, tensor, op, name):
        assert op == self.Sum
        return tensor + mx.nd.array(self.rank0.pop(0), dtype=tensor.dtype)

    def grouped_allreduce_(self, tensors, op, name):
        assert op == self.Sum
        for tensor in tensors:
            tensor[:] = tensor + mx.nd.array(self.rank0.pop(0), dtype=tensor.dtype)

    def broadcast(self, *args, **kwargs):
        raise AssertionError('Horovod 0.28.1 broadcast (use-after-free)')

    broadcast_ = broadcast_parameters = broadcast


def world_of_rank1(rank0):
    world = workers.World('device')
    world.horovod, world.rank, world.size = TwoWorkerHorovod(rank0), 1, 2
    return world


def test_broadcasts_give_rank_0s_values_without_horovods_broadcast():
    assert world_of_rank1([[123456789.0]]).broadcast_int(7) == 123456789

    net = gluon.nn.Dense(3, in_units=2)
    net.initialize(mx.init.Constant(5))
    params = net.collect_params()
    rank0 = [np.arange(6, dtype=np.float32).reshape(3, 2) / 7, np.array([-1.5, 0, np.inf], np.float32)]
    by_name = dict(zip(sorted(params.keys()), reversed(rank0)))      # sorted: bias before weight
    world_of_rank1([by_name[name] for name in sorted(params.keys())]).broadcast_parameters(params)
    for name, param in params.items():
        np.testing.assert_array_equal(param.data().asnumpy(), by_name[name])
