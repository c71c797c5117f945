"""checkpoint.py: the .state round trip, clear errors for corrupt and mismatched files; logs.atomic_path."""
import json
import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

import checkpoint
import logs
from errors import RecipeError


def tiny_net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(4, in_units=3), gluon.nn.BatchNorm(in_channels=4), gluon.nn.Dense(2, in_units=4))
    net.initialize()
    return net


def test_state_round_trip(tmp_path):
    net = tiny_net()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9})
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, 3))).sum()
    loss.backward()
    trainer.step(2)
    path = str(tmp_path / 'm_last.state')
    checkpoint.save_state(path, net, trainer, {'epoch': 3, 'iteration': 7})
    params, trainer_states, meta = checkpoint.read_state(path)
    assert meta == {'epoch': 3, 'iteration': 7}
    other = tiny_net()
    checkpoint.load_params_into(other, params, [mx.cpu()], path)
    x = mx.nd.random.uniform(shape=(2, 3))
    np.testing.assert_array_equal(net(x).asnumpy(), other(x).asnumpy())
    assert len(trainer_states) > 0
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)   # ordinary permissions, not mkstemp's


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / 'report.json'
    logs.write_json(str(path), {'a': 1})
    with pytest.raises(ValueError):
        logs.write_json(str(path), {'a': float('nan')})     # strict JSON refuses NaN mid-write
    assert json.loads(path.read_text()) == {'a': 1}
    assert [p.name for p in tmp_path.iterdir()] == ['report.json']   # no temporary left behind


def test_corrupt_state_is_a_clear_error(tmp_path):
    path = tmp_path / 'model_last.state'
    path.write_bytes(b'not a checkpoint')
    with pytest.raises(RecipeError, match='not a readable checkpoint'):
        checkpoint.read_state(str(path))


def test_mismatched_checkpoint_is_a_clear_error(tmp_path):
    net = tiny_net()
    path = str(tmp_path / 'w.params')
    net.save_parameters(path)
    other = gluon.nn.HybridSequential()
    other.add(gluon.nn.Dense(4, in_units=3))
    other.initialize()
    with pytest.raises(RecipeError, match='does not match this network'):
        checkpoint.load_weights(other, path, [mx.cpu()])


