"""fit.py: schedule, targets, loss scaling, and the training step in float16 and on several devices."""
import math

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

import fit
import losses
import workers
from conftest import resolved
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
    targets = losses.smoothed_one_hot(mx.nd.array([2, 0]), 1000, 0.1).asnumpy()
    assert targets[0, 2] == pytest.approx(0.9001)
    assert targets[0, 0] == pytest.approx(0.0001)
    assert targets.sum(axis=1) == pytest.approx([1, 1])


def test_mixup_pairs_reversed_batch():
    images = mx.nd.array(np.arange(3 * 2).reshape(3, 2, 1, 1))
    targets = losses.smoothed_one_hot(mx.nd.array([0, 1, 2]), 3, 0.0)
    lam = mx.nd.array([1.0, 0.5, 0.25])
    mixed_images, mixed_targets = losses.mixup(images, targets, lam)
    np.testing.assert_allclose(mixed_images.asnumpy()[:, :, 0, 0], [[0, 1], [2, 3], [0.25 * 4 + 0.75 * 0,
                                                                                     0.25 * 5 + 0.75 * 1]])
    np.testing.assert_allclose(mixed_targets.asnumpy(), [[1, 0, 0], [0, 1, 0], [0.75, 0, 0.25]])


def test_mixup_weights_are_a_function_of_position():
    a = losses.mixup_weights(7, 3, 11, 0, 0, 8, 0.2)
    assert np.array_equal(a, losses.mixup_weights(7, 3, 11, 0, 0, 8, 0.2))
    assert not np.array_equal(a, losses.mixup_weights(7, 3, 12, 0, 0, 8, 0.2))
    assert ((a >= 0) & (a <= 1)).all()


# ---- loss scaling -----------------------------------------------------------------------------------------

def test_dynamic_loss_scale_halves_on_overflow_and_grows():
    param = gluon.Parameter('w', shape=(3,))
    param.initialize()
    scale = losses.DynamicLossScale(scale=8.0, interval=2)
    param.list_grad()[0][:] = mx.nd.array([1, np.inf, 0])
    assert scale.overflowed([param]) and scale.scale == 4.0 and scale.skipped == 1
    param.list_grad()[0][:] = mx.nd.array([1, 2, 3])
    assert not scale.overflowed([param]) and not scale.overflowed([param])
    assert scale.scale == 8.0


# ---- the training step with float16 and several devices, on the CPU (twins of the GPU paths) ---------------

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


def step_for(net, dtype='float32', contexts=(mx.cpu(),), batch=8):
    args = resolved(['--batch-size', str(batch), '--lr', '0.1', '--wd', '0', '--label-smoothing', '0.1',
                     '--num-classes', '3', '--seed', '1', '--kv-store', 'device'])
    args.dtype, args.contexts = dtype, list(contexts)
    net.initialize(ctx=args.contexts)
    if dtype == 'float16':
        net.cast('float16')
    return fit.TrainingStep(args, net, workers.World('device'))


def batch_of(values, labels, dtype='float32'):
    return mx.io.DataBatch(data=[mx.nd.array(values, dtype=dtype)], label=[mx.nd.array(labels)])


def test_float16_step_with_loss_scaling_skips_overflows_and_grows():
    """The GPU default (--dtype float16 without AMP): float16 and float32 gradients side by side (they
    crashed multi_all_finite before), float32 master weights, growth after clean steps, a skipped step on an
    inf gradient, and the divergence stop at the floor."""
    mx.random.seed(0)
    step = step_for(Float16Net(), 'float16')
    step.loss_scale = losses.DynamicLossScale(scale=8.0, interval=2)
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)
    weight = step.net.weight
    assert np.dtype(weight.dtype) == np.float16 and np.dtype(step.net.bn.gamma.dtype) == np.float32
    before = weight.data().asnumpy().copy()
    values = [float(step.run(batch_of(images, labels, 'float16'), 0, i, 0.1).asscalar()) for i in range(2)]
    assert all(np.isfinite(values)) and step.loss_scale.scale == 16.0          # doubled after 2 clean steps
    assert not np.array_equal(weight.data().asnumpy(), before)
    assert step.gluon_trainer._updaters[0].states[0][0].dtype == np.float32    # float32 master weights
    bad = images.copy()
    bad[0, 0, 0, 0] = np.inf
    trained = weight.data().asnumpy().copy()
    step.run(batch_of(bad, labels, 'float16'), 0, 2, 0.1)
    assert step.loss_scale.scale == 8.0 and step.loss_scale.skipped == 1
    np.testing.assert_array_equal(weight.data().asnumpy(), trained)             # the step was skipped
    restored = losses.DynamicLossScale()
    restored.restore(step.scaler_state())
    assert restored.state() == {'scale': 8.0, 'clean_steps': 0, 'skipped': 1}
    step.loss_scale.scale = 1.0
    with pytest.raises(RecipeError, match='loss scale fell below 1 at epoch 0 iteration 3'):
        step.run(batch_of(bad, labels, 'float16'), 0, 3, 0.1)


def test_two_devices_in_one_process_follow_one_device():
    """--kv-store device over two CPU contexts: each takes half the batch, gradients are summed over the
    devices; without batchnorm (whose statistics are per device) the losses equal one device's."""
    rng = np.random.default_rng(1)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)) for _ in range(4)]
    trajectories = []
    for contexts in ([mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]):
        mx.random.seed(5)
        step = step_for(Float16Net(batchnorm=False), contexts=contexts)
        trajectories.append([float(step.run(b, 0, i, 0.5).asscalar()) for i, b in enumerate(batches)])
    np.testing.assert_allclose(trajectories[1], trajectories[0], rtol=1e-5)
    assert trajectories[0][-1] < trajectories[0][0]
