"""Unit tests of fit.py's pure parts and logs.py: schedule, targets, loss scaling, checkpoint files, DLLogger."""
import json
import math
import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

import fit
import logs
from errors import RecipeError


# ---- learning rate schedule -------------------------------------------------------------------------------

def lr(progress, **kw):
    options = dict(base_lr=1.0, num_epochs=90, warmup_epochs=5, schedule='cosine', steps=(), factor=0.1)
    options.update(kw)
    return fit.learning_rate(progress, **options)


def test_warmup_is_linear_from_zero():
    assert lr(0) == 0
    assert lr(2.5) == pytest.approx(0.5)
    assert lr(5 - 1e-9) == pytest.approx(1.0)


def test_cosine_known_points():
    assert lr(5) == pytest.approx(1.0)
    assert lr(47.5) == pytest.approx(0.5)                      # half way through the cosine span
    assert lr(5 + 85 / 4) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr(90) == 0 and lr(100) == 0


def test_cosine_segments_restart_scaled():
    kw = dict(steps=[30, 60], factor=0.5)
    assert lr(30, **kw) == pytest.approx(0.5)                  # segment 1 restarts at base * factor
    assert lr(60, **kw) == pytest.approx(0.25)
    assert lr(45, **kw) == pytest.approx(0.25)                 # middle of segment 1: half of 0.5


def test_multistep_known_points():
    kw = dict(schedule='multistep', steps=[30, 60], factor=0.1)
    assert lr(10, **kw) == pytest.approx(1.0)
    assert lr(30, **kw) == pytest.approx(0.1)
    assert lr(59.9, **kw) == pytest.approx(0.1)
    assert lr(60, **kw) == pytest.approx(0.01)
    assert lr(2.5, **kw) == pytest.approx(0.5)


def test_no_warmup():
    assert lr(0, warmup_epochs=0) == pytest.approx(1.0)


# ---- targets ----------------------------------------------------------------------------------------------

def test_label_smoothing_targets():
    targets = fit.smoothed_one_hot(mx.nd.array([2, 0]), 1000, 0.1).asnumpy()
    assert targets[0, 2] == pytest.approx(0.9001)
    assert targets[0, 0] == pytest.approx(0.0001)
    assert targets.sum(axis=1) == pytest.approx([1, 1])


def test_mixup_pairs_reversed_batch():
    images = mx.nd.array(np.arange(3 * 2).reshape(3, 2, 1, 1))
    targets = fit.smoothed_one_hot(mx.nd.array([0, 1, 2]), 3, 0.0)
    lam = mx.nd.array([1.0, 0.5, 0.25])
    mixed_images, mixed_targets = fit.mixup(images, targets, lam)
    np.testing.assert_allclose(mixed_images.asnumpy()[:, :, 0, 0], [[0, 1], [2, 3], [0.25 * 4 + 0.75 * 0,
                                                                                     0.25 * 5 + 0.75 * 1]])
    np.testing.assert_allclose(mixed_targets.asnumpy(), [[1, 0, 0], [0, 1, 0], [0.75, 0, 0.25]])


def test_mixup_weights_are_a_function_of_position():
    a = fit.mixup_weights(7, 3, 11, 0, 0, 8, 0.2)
    assert np.array_equal(a, fit.mixup_weights(7, 3, 11, 0, 0, 8, 0.2))
    assert not np.array_equal(a, fit.mixup_weights(7, 3, 12, 0, 0, 8, 0.2))
    assert ((a >= 0) & (a <= 1)).all()


# ---- loss scaling -----------------------------------------------------------------------------------------

def test_dynamic_loss_scale_halves_on_overflow_and_grows():
    param = gluon.Parameter('w', shape=(3,))
    param.initialize()
    scale = fit.DynamicLossScale(scale=8.0, interval=2)
    param.list_grad()[0][:] = mx.nd.array([1, np.inf, 0])
    assert scale.overflowed([param]) and scale.scale == 4.0 and scale.skipped == 1
    param.list_grad()[0][:] = mx.nd.array([1, 2, 3])
    assert not scale.overflowed([param]) and not scale.overflowed([param])
    assert scale.scale == 8.0


# ---- checkpoint files -------------------------------------------------------------------------------------

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
    fit.save_state(path, net, trainer, {'epoch': 3, 'iteration': 7})
    params, trainer_states, meta = fit.read_state(path)
    assert meta == {'epoch': 3, 'iteration': 7}
    other = tiny_net()
    fit.load_params_into(other, params, [mx.cpu()], path)
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
        fit.read_state(str(path))


def test_mismatched_checkpoint_is_a_clear_error(tmp_path):
    net = tiny_net()
    path = str(tmp_path / 'w.params')
    net.save_parameters(path)
    other = gluon.nn.HybridSequential()
    other.add(gluon.nn.Dense(4, in_units=3))
    other.initialize()
    with pytest.raises(RecipeError, match='does not match this network'):
        fit.load_weights(other, path, [mx.cpu()])


# ---- DLLogger format --------------------------------------------------------------------------------------

def test_dllogger_records(tmp_path, capsys):
    path = tmp_path / 'dll.log'
    logger = logs.DLLogger(str(path))
    logger.log('PARAMETER', {'lr': 0.1})
    logger.log((0, 20), {'train.loss': 2.5, 'train.ips': 100.0})
    logger.log((0,), {'val.accuracy': 0.5})
    logger.log((), {'val.accuracy': 0.5})
    logger.close()
    lines = path.read_text().splitlines()
    assert all(line.startswith('DLLL {') for line in lines)
    records = [json.loads(line[5:]) for line in lines]
    metadata = [r for r in records if r['type'] == 'METADATA']
    assert {'metric': 'train.ips', 'metadata': {'unit': 'images/s'}}.items() <= \
        next(r for r in metadata if r['metric'] == 'train.ips').items()
    entries = [r for r in records if r['type'] == 'LOG']
    assert [r['step'] for r in entries] == ['PARAMETER', [0, 20], [0], []]
    for r in entries:
        assert isinstance(r['timestamp'], str) and isinstance(r['elapsedtime'], str)
        assert len(r['datetime']) == len('2024-01-01 00:00:00.000000')
    assert logs.read_dllogger(str(path))[1]['data'] == {'train.loss': 2.5, 'train.ips': 100.0}
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith('DLL ') and out[1].endswith('- Epoch: 0 Iteration: 20 train.loss : 2.5 '
                                                           'train.ips : 100 images/s')
    assert out[3].endswith('- Summary: val.accuracy : 0.5')


def test_steady_durations_drop_warmup():
    assert fit.steady_durations([9.0]) == [9.0]
    assert fit.steady_durations([9.0, 1, 1]) == [1, 1]
    assert len(fit.steady_durations([1.0] * 50)) == 45
    assert len(fit.steady_durations([1.0] * 5000)) == 4900
