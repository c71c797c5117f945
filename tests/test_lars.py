"""--optimizer lars (lars.py) against MLPerf's LARS written out here: one step of the recipe's TrainingStep, each
parameter: weights of 2+ dimensions get lr x eta x ||w|| / (||g|| + wd x ||w|| + eps) with weight decay and
momentum, 1-dimensional ones (batchnorm gamma/beta, biases) plain SGD without weight decay; float32 and the
float16 twin (float32 master weights); on 1 worker and on 2 (tests/lars_workers.py)."""
import shutil

import mxnet as mx
import numpy as np
import pytest

from rn50.checkpoints import optimizer_state
from rn50.optim import lars
from rn50.training import losses
import models
from conftest import gloo_workers
from float16_twin import Float16Net, batch_of, step_for
from lars_workers import EPS, ETA, FLAGS, LR, MOMENTUM, WD


def expected_step(before, grad, velocity=0.0):
    """One LARS update in float64: (weights after, velocity after), from `velocity` (0 at the first step)."""
    if before.ndim > 1:
        w_norm, g_norm = np.linalg.norm(before), np.linalg.norm(grad)
        trust = ETA * w_norm / (g_norm + WD * w_norm + EPS) if w_norm > 0 and g_norm > 0 else 1.0
        velocity = MOMENTUM * velocity + LR * trust * (grad + WD * before)
    else:
        velocity = MOMENTUM * velocity + LR * grad
    return before - velocity, velocity


def expected_after_one_step(before, grad):
    return expected_step(before, grad)[0]


def trained(step):
    """{name: parameter} of what the optimizer updates."""
    return {name: p for name, p in step.net._collect_params_with_prefix().items() if p.grad_req != 'null'}


def snapshot(params, rescale=1.0, grads=False):
    return {name: (p.grad() if grads else p.data()).asnumpy().astype(np.float64) * rescale
            for name, p in params.items()}


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
@pytest.mark.unit
def test_one_lars_step_of_every_parameter_follows_the_formula(dtype):
    mx.random.seed(3)
    step = step_for(Float16Net(), dtype, extra=FLAGS)
    if step.loss_scale is not None:   # float16: a scale whose gradients fit (the default overflows this tiny net)
        step.loss_scale = losses.DynamicLossScale(scale=8.0)
    params = trained(step)
    before = snapshot(params)
    rng = np.random.default_rng(1)
    step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), dtype), 0, 0, LR)
    optimizer = step.gluon_trainer._optimizer
    assert type(optimizer).__name__ == 'MLPerfLARS' and optimizer.momentum == MOMENTUM
    for name, param in params.items():
        grad = param.grad().asnumpy().astype(np.float64) * optimizer.rescale_grad
        want = expected_after_one_step(before[name], grad)
        got = param.data().asnumpy().astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == 'float16' else 1e-5, atol=1e-6, err_msg=name)
        assert not np.allclose(got, before[name])     # every trained parameter moved
    assert {name for name in params if params[name].data().ndim > 1} == {'weight'}


def local_gradients(before, rank):
    """The gradient of worker `rank`'s batch alone (mean loss over its 8 images), float32, in one process."""
    net = Float16Net()
    net.initialize()
    rng = np.random.default_rng(10 + rank)   # the batch tests/lars_workers.py gives that worker
    images, labels = mx.nd.array(rng.normal(size=(8, 4, 2, 2))), mx.nd.array(rng.integers(0, 3, 8))
    net(images)
    params = net._collect_params_with_prefix()
    for name, value in before.items():
        params[name].set_data(mx.nd.array(value))
    with mx.autograd.record():
        loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(images), labels).mean()
    loss.backward()
    return {name: params[name].grad().asnumpy().astype(np.float64) for name in before}


@pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
@pytest.mark.multiworker
def test_two_workers_take_the_trust_ratio_of_the_averaged_gradient(tmp_path):
    """2 Gloo workers, each with its own batch: the gradient the optimizer saw is the mean of the workers'
    gradients (not one worker's, not their sum) on both, and each parameter moved by the formula above with
    that gradient, identically on both workers; float32 and the float16 twin."""
    results = gloo_workers('lars_workers.py', tmp_path / 'lars.json')
    for dtype, params in results.items():
        rows = {name: {key: np.array(p[key], dtype=np.float64).reshape([2] + p['shape'])
                       for key in ('before', 'grad', 'after')} for name, p in params.items()}
        before = {name: r['before'][0] for name, r in rows.items()}
        if dtype == 'float32':
            local = [local_gradients(before, rank) for rank in (0, 1)]
        for name, r in rows.items():
            np.testing.assert_array_equal(r['before'][0], r['before'][1], err_msg=name)   # broadcast
            np.testing.assert_array_equal(r['after'][0], r['after'][1], err_msg=name)
            np.testing.assert_allclose(r['grad'][0], r['grad'][1], rtol=1e-6, err_msg=name)
            if dtype == 'float32':
                assert not np.allclose(local[0][name], local[1][name])             # the batches differ
                np.testing.assert_allclose(r['grad'][0], (local[0][name] + local[1][name]) / 2,
                                           rtol=1e-4, atol=1e-7, err_msg=name)
            want = expected_after_one_step(r['before'][0], r['grad'][0])
            np.testing.assert_allclose(r['after'][0], want, rtol=2e-3 if dtype == 'float16' else 1e-5, atol=1e-6,
                                       err_msg=f'{dtype} {name}')
            assert not np.allclose(r['after'][0], r['before'][0])


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
@pytest.mark.unit
def test_the_second_lars_step_carries_the_momentum(dtype):
    """Two steps on different batches: the second adds momentum x the first step's velocity to its own."""
    mx.random.seed(3)
    step = step_for(Float16Net(), dtype, extra=FLAGS)
    if step.loss_scale is not None:
        step.loss_scale = losses.DynamicLossScale(scale=8.0)
    params = trained(step)
    rng = np.random.default_rng(2)
    want, velocity = snapshot(params), dict.fromkeys(params, 0.0)
    for iteration in range(2):
        step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), dtype), 0, iteration, LR)
        grads = snapshot(params, step.gluon_trainer._optimizer.rescale_grad, grads=True)
        for name in params:
            want[name], velocity[name] = expected_step(want[name], grads[name], velocity[name])
    for name, got in snapshot(params).items():
        np.testing.assert_allclose(got, want[name], rtol=3e-3 if dtype == 'float16' else 1e-5, atol=1e-6,
                                   err_msg=name)


@pytest.mark.unit
def test_every_array_of_a_resnet_follows_the_formula():
    """ResNet-18's 62 trained arrays: more than one multi-tensor call (60 arrays each), weights of 4 and 2
    dimensions among batchnorm and bias vectors, each updated by its own trust ratio."""
    mx.random.seed(4)
    step = step_for(models.get_model(num_layers=18, num_classes=3, image_shape=(3, 16, 16)), extra=FLAGS)
    params = trained(step)
    assert len(params) > lars.ARRAYS_PER_CALL
    before = snapshot(params)
    rng = np.random.default_rng(5)
    step.run(batch_of(rng.normal(size=(8, 3, 16, 16)), rng.integers(0, 3, 8)), 0, 0, LR)
    grads = snapshot(params, step.gluon_trainer._optimizer.rescale_grad, grads=True)
    for name, got in snapshot(params).items():
        np.testing.assert_allclose(got, expected_after_one_step(before[name], grads[name]), rtol=1e-4, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize('multiplier', [[], ['--backbone-lr-mult', '0.1']])
@pytest.mark.unit
def test_the_rates_stay_on_the_device_between_steps(monkeypatch, multiplier):
    """The learning rates and weight decays of a step are made on the device from copies made once: no
    blocking host-to-device copy per update once the first step has made them (the rate changes every step
    of a schedule; a new --wd after a resume copies the decays again), and the steps still follow the formula
    (the tests above). With rate multipliers other than 1 (--backbone-lr-mult) too: the cache compared
    (rate x multiplier) / rate, which is not the multiplier to the bit at every rate, and missed."""
    mx.random.seed(3)
    step = step_for(Float16Net(), 'float32', extra=FLAGS + multiplier)
    trained(step)
    rng = np.random.default_rng(2)
    step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)), 0, 0, LR)
    mx.nd.waitall()
    copies = []
    original = mx.nd.NDArray._sync_copyfrom
    monkeypatch.setattr(mx.nd.NDArray, '_sync_copyfrom', lambda self, source: (copies.append(self.shape),
                                                                              original(self, source))[1])
    optimizer = step.gluon_trainer._optimizer
    for iteration, lr in ((1, 0.4 * 13 / 97), (2, 0.4 * 19 / 97)):   # a schedule's rates; (r x 0.1) / r is not 0.1
        batch = batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8))
        copies.clear()
        step.run(batch, 0, iteration, lr)
        mx.nd.waitall()
        updater_copies = [shape for shape in copies if len(shape) == 1 and shape[0] <= lars.ARRAYS_PER_CALL]
        assert not updater_copies, updater_copies
    optimizer.wd *= 2     # a changed weight decay is copied again
    copies.clear()
    step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)), 0, 3, LR)
    mx.nd.waitall()
    assert copies


@pytest.mark.unit
def test_a_state_of_the_first_lars_resumes_with_its_momentum(tmp_path):
    """The first version of lars.py kept the momentum's negation: its state, loaded, continues the same run."""
    mx.random.seed(6)
    rng = np.random.default_rng(7)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)) for _ in range(2)]
    running = step_for(Float16Net(), extra=FLAGS)
    running.run(batches[0], 0, 0, LR)
    optimizer, updater = running.gluon_trainer._optimizer, running.gluon_trainer._updaters[0]
    del optimizer.momentum_sign                      # as the first version pickled it
    for momentum, _ in updater.states.values():
        momentum *= -1
    state = optimizer_state.trainer_state_bytes(running.gluon_trainer)
    for momentum, _ in updater.states.values():     # the uninterrupted run goes on with its own momentum
        momentum *= -1
    optimizer.momentum_sign = 'mxnet'
    resumed = step_for(Float16Net(), extra=FLAGS)
    resumed.net(batches[0].data[0])
    for name, param in resumed.net._collect_params_with_prefix().items():
        param.set_data(running.net._collect_params_with_prefix()[name].data())
    optimizer_state.restore_trainer_state(resumed.gluon_trainer, state)
    for step in (running, resumed):
        step.run(batches[1], 0, 1, LR)
    for name, got in snapshot(trained(resumed)).items():
        np.testing.assert_allclose(got, snapshot(trained(running))[name], rtol=1e-6, err_msg=name)


@pytest.mark.unit
def test_a_state_written_before_the_modules_moved_into_rn50_resumes(tmp_path, monkeypatch):
    """A .state of a LARS run written before the layout change pickled its optimizer as lars.MLPerfLARS (module
    `lars`, which no longer exists): it loads, and the run continues exactly."""
    import sys
    mx.random.seed(6)
    rng = np.random.default_rng(7)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)) for _ in range(2)]
    running = step_for(Float16Net(), extra=FLAGS)
    running.run(batches[0], 0, 0, LR)
    with monkeypatch.context() as before:              # the optimizer's class as the old layout named it
        before.setattr(lars.MLPerfLARS, '__module__', 'lars')
        before.setitem(sys.modules, 'lars', lars)
        state = optimizer_state.trainer_state_bytes(running.gluon_trainer)
    assert b'lars' in state and b'rn50.optim.lars' not in state and 'lars' not in sys.modules
    resumed = step_for(Float16Net(), extra=FLAGS)
    resumed.net(batches[0].data[0])
    for name, param in resumed.net._collect_params_with_prefix().items():
        param.set_data(running.net._collect_params_with_prefix()[name].data())
    optimizer_state.restore_trainer_state(resumed.gluon_trainer, state)
    assert type(resumed.gluon_trainer._optimizer) is lars.MLPerfLARS
    for step in (running, resumed):
        step.run(batches[1], 0, 1, LR)
    for name, got in snapshot(trained(resumed)).items():
        np.testing.assert_allclose(got, snapshot(trained(running))[name], rtol=1e-6, err_msg=name)
