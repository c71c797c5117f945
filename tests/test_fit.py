"""Unit tests of fit.py's pure parts: schedule, targets, loss scaling."""
import math

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

import fit


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
