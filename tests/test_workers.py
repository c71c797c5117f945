"""workers.Communicator's collectives on a stand-in for Horovod that plays two workers: broadcasts come out as rank
0's values and never go through Horovod's broadcast ops (a use-after-free in Horovod 0.28.1 crashed about one
start in 25; see World)."""
import functools
import glob
import os
import re

import mxnet as mx
import pytest
import numpy as np
from mxnet import gluon

from rn50.world import workers
from conftest import ROOT, horovod_says

pytestmark = pytest.mark.unit


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


class Horovod020:
    """The API of Horovod 0.20: no `op` keyword, no `Sum` (a sum is `average=False`; the default averages),
    no grouped all-reduce."""

    def __init__(self, rank0):
        self.rank0 = list(rank0)

    def allreduce(self, tensor, average=True, name=None):
        assert average is False
        return tensor + mx.nd.array(self.rank0.pop(0), dtype=tensor.dtype)

    def allreduce_(self, tensor, average=True, name=None):
        tensor[:] = self.allreduce(tensor, average, name)


class Horovod024(Horovod020):
    """The API of Horovod 0.21-0.24 (NVIDIA's MXNet containers up to 22.05): a grouped all-reduce, still no
    `op` and no `Sum`."""

    def grouped_allreduce_(self, tensors, average=True, name=None):
        for tensor in tensors:
            self.allreduce_(tensor, average, name)


def world_of_rank1(rank0, horovod=TwoWorkerHorovod):
    return workers.Communicator(horovod(rank0), rank=1, size=2)


@pytest.mark.parametrize('horovod', [TwoWorkerHorovod, Horovod024, Horovod020])
def test_broadcasts_give_rank_0s_values_without_horovods_broadcast(horovod):
    """On every Horovod API from 0.20 to 0.28 (the old ones have no op=/Sum: a call with op= crashed on them)."""
    world_of_rank1 = functools.partial(globals()['world_of_rank1'], horovod=horovod)
    assert world_of_rank1([[123456789.0]]).broadcast_int(7) == 123456789

    net = gluon.nn.Dense(3, in_units=2)
    net.initialize(mx.init.Constant(5))
    params = net.collect_params()
    rank0 = [np.arange(6, dtype=np.float32).reshape(3, 2) / 7, np.array([-1.5, 0, np.inf], np.float32)]
    by_name = dict(zip(sorted(params.keys()), reversed(rank0)))      # sorted: bias before weight
    world_of_rank1([by_name[name] for name in sorted(params.keys())]).broadcast_parameters(params)
    for name, param in params.items():
        np.testing.assert_array_equal(param.data().asnumpy(), by_name[name])


def test_the_horovod_api_the_recipe_calls_is_checked_with_one_error():
    import types
    from rn50.errors import RecipeError
    # the installed Horovod has all of it
    assert horovod_says('workers.check_horovod_api(hvd)', 'from rn50.world import workers') is None
    lacking = types.SimpleNamespace(**{name: None for name in workers.HOROVOD_API if name != 'DistributedTrainer'})
    with pytest.raises(RecipeError, match='lacks DistributedTrainer, which this recipe calls'):
        workers.check_horovod_api(lacking)


def test_batchnorm_statistics_are_averaged_over_devices_and_workers():
    """Rank 1 of 2 with two device copies: each array becomes the mean over both copies and rank 0's (whose
    own mean is 10 here), on every copy; arrays of other shapes keep their place in the flat all-reduce."""
    class Rank1Of2:
        size, rank = 2, 1

        def allreduce_sum(self, values):
            return values + 10.0              # rank 0 contributes 10 everywhere
    mean = mx.nd.array([1.0, 3.0])
    copies = [[mean.copy(), mx.nd.array([3.0, 5.0])], [mx.nd.ones((2, 2)), mx.nd.ones((2, 2)) * 3]]
    workers.Communicator.average_copies(Rank1Of2(), copies)
    for copy in copies[0]:
        np.testing.assert_allclose(copy.asnumpy(), [(2 + 10) / 2, (4 + 10) / 2])
    for copy in copies[1]:
        np.testing.assert_allclose(copy.asnumpy(), np.full((2, 2), (2 + 10) / 2))


def test_gradient_groups_are_passed_where_horovod_takes_them(caplog):
    """The original runner's MXNET_HOROVOD_NUM_GROUPS=16, which upstream Horovod reads from no variable: the step
    passes it to DistributedTrainer as num_groups (Horovod 0.21 and newer), and says so where it cannot."""
    from rn50.training import step

    class Horovod020Trainer:
        @staticmethod
        def DistributedTrainer(params, optimizer, optimizer_params=None):
            return None
    assert horovod_says("[step.grouping(hvd, {'MXNET_HOROVOD_NUM_GROUPS': n}) for n in ('16', '0')] + "
                        "[step.grouping(hvd, {})]", 'from rn50.training import step') == [{'num_groups': 16}, {}, {}]
    with caplog.at_level('WARNING'):
        assert step.grouping(Horovod020Trainer, {'MXNET_HOROVOD_NUM_GROUPS': '16'}) == {}
    assert 'has no num_groups' in caplog.text


def test_no_test_imports_horovod_in_the_test_process():
    """conftest.horovod_says runs what needs horovod.mxnet in a process of its own: imported in a pytest-xdist
    worker without hvd.init(), it made a later test's DALI pipeline in that worker abort."""
    found = [f'{os.path.basename(path)}:{n}' for path in sorted(glob.glob(os.path.join(ROOT, 'tests', 'test_*.py')))
             for n, line in enumerate(open(path), 1) if re.match(r'\s*(import|from)\s+horovod\b', line)]
    assert found == []
