"""--optimizer lamb (lamb.py) against timm's Lamb written out here: three steps of the recipe's TrainingStep,
every parameter, float32 and the float16 twin (float32 master weights). Arrays with weight decay get the trust
ratio ||w|| / ||u||, those without (batchnorm gamma/beta, wd_mult 0 as in the recipe's networks) none; every
gradient is first divided by max(1, global norm / max_grad_norm)."""
import pickle

import mxnet as mx
import numpy as np
import pytest

from rn50.checkpoints import optimizer_state
from rn50.optim import lamb
from rn50.training import losses
from float16_twin import Float16Net, batch_of, step_for

pytestmark = pytest.mark.unit

LR, WD, BETA1, BETA2, EPS = 0.05, 0.02, 0.9, 0.999, 1e-6


def expected_steps(before, steps_grads, max_norm):
    """timm's Lamb in float64 from `before` ({name: array}) over the gradients of each step ({name: array}, the
    mean-loss gradients the optimizer saw); batchnorm arrays (names starting 'bn') have no weight decay."""
    weights = {name: value.copy() for name, value in before.items()}
    mean = {name: np.zeros_like(value) for name, value in before.items()}
    var = {name: np.zeros_like(value) for name, value in before.items()}
    for t, grads in enumerate(steps_grads, start=1):
        divisor = max(1.0, np.sqrt(sum(np.sum(g ** 2) for g in grads.values())) / max_norm)
        for name, w in weights.items():
            g = grads[name] / divisor
            mean[name] = BETA1 * mean[name] + (1 - BETA1) * g
            var[name] = BETA2 * var[name] + (1 - BETA2) * g ** 2
            update = (mean[name] / (1 - BETA1 ** t)) / (np.sqrt(var[name] / (1 - BETA2 ** t)) + EPS)
            wd = 0.0 if name.startswith('bn') else WD
            trust = 1.0
            if wd:
                update = update + wd * w
                w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(update)
                trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            weights[name] = w - LR * trust * update
    return weights


def lamb_step(dtype, contexts=(mx.cpu(),), kind='cpu'):
    mx.random.seed(5)
    net = Float16Net()
    for param in net.bn.collect_params().values():
        param.wd_mult = 0.0      # as layers.py sets it on the recipe's batchnorm layers
    step = step_for(net, dtype, contexts=contexts, kind=kind,
                    extra=['--optimizer', 'lamb', '--wd', str(WD), '--label-smoothing', '0'])
    if step.loss_scale is not None:   # float16: a scale whose gradients fit (the default overflows this tiny net)
        step.loss_scale = losses.DynamicLossScale(scale=8.0)
    # Norms unlike an update's at the first step (gamma 1 and beta 0 would give a trust ratio of 1 anyway).
    net.bn.gamma.set_data(mx.nd.array([2.5, 1.5, 3.0, 2.0]))
    net.bn.beta.set_data(mx.nd.array([0.3, -0.2, 0.1, 0.4]))
    return step


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
@pytest.mark.parametrize('max_norm', [10.0, 0.05])
def test_three_lamb_steps_of_every_parameter_follow_timms_formula(dtype, max_norm):
    step = lamb_step(dtype)
    optimizer = step.gluon_trainer._optimizer
    assert isinstance(optimizer, lamb.TimmLAMB) and optimizer.max_grad_norm == lamb.MAX_GRAD_NORM
    optimizer.max_grad_norm = max_norm       # global norms 0.79-0.96 here: 0.05 clips every step, 10 none
    params = {name: p for name, p in step.net._collect_params_with_prefix().items() if p.grad_req != 'null'}
    before = {name: p.data().asnumpy().astype(np.float64) for name, p in params.items()}
    rng = np.random.default_rng(2)
    steps_grads, divisors = [], []
    for iteration in range(3):
        step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), dtype), 0, iteration, LR)
        steps_grads.append({name: p.grad().asnumpy().astype(np.float64) * optimizer.rescale_grad
                            for name, p in params.items()})
        divisors.append(optimizer.clip_divisor.asscalar())
    assert (min(divisors) > 1) == (max_norm < 1)
    want = expected_steps(before, steps_grads, max_norm)
    for name, param in params.items():
        got = param.data().asnumpy().astype(np.float64)
        np.testing.assert_allclose(got, want[name], rtol=2e-3 if dtype == 'float16' else 1e-5, atol=1e-5,
                                   err_msg=name)
        assert not np.allclose(got, before[name])


def test_two_devices_of_one_process_take_the_same_clipped_steps():
    """--kv-store device (several GPUs in one process), twinned by two CPU contexts: each device's updater
    applies the step's one clip divisor and its own step counts; both copies follow the formula."""
    contexts = (mx.cpu(0), mx.cpu(1))
    step = lamb_step('float32', contexts)
    optimizer = step.gluon_trainer._optimizer
    optimizer.max_grad_norm = 0.05
    params = {name: p for name, p in step.net._collect_params_with_prefix().items() if p.grad_req != 'null'}
    before = {name: p.data(contexts[0]).asnumpy().astype(np.float64) for name, p in params.items()}
    rng = np.random.default_rng(2)
    steps_grads = []
    for iteration in range(3):
        step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)), 0, iteration, LR)
        steps_grads.append({name: p.grad(contexts[0]).asnumpy().astype(np.float64) * optimizer.rescale_grad
                            for name, p in params.items()})
    want = expected_steps(before, steps_grads, 0.05)
    for name, param in params.items():
        for ctx in contexts:
            np.testing.assert_allclose(param.data(ctx).asnumpy(), want[name], rtol=1e-5, atol=1e-5,
                                       err_msg=f'{name} on {ctx}')


def test_mxnets_lamb_would_take_the_trust_ratio_of_batchnorm_and_clip_nothing():
    """The reason for lamb.py: MXNet's own lamb on the same steps differs from timm's formula on the batchnorm
    arrays (so the test above can fail)."""
    step = lamb_step('float32')
    step.gluon_trainer._optimizer.__class__ = mx.optimizer.LAMB
    params = {name: p for name, p in step.net._collect_params_with_prefix().items() if p.grad_req != 'null'}
    before = {name: p.data().asnumpy().astype(np.float64) for name, p in params.items()}
    rng = np.random.default_rng(2)
    step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)), 0, 0, LR)
    grads = {name: p.grad().asnumpy().astype(np.float64) * step.gluon_trainer._optimizer.rescale_grad
             for name, p in params.items()}
    want = expected_steps(before, [grads], lamb.MAX_GRAD_NORM)
    assert not np.allclose(params['bn.gamma'].data().asnumpy(), want['bn.gamma'], rtol=1e-4)


def test_a_pickled_optimizer_holds_no_gradient_norm():
    step = lamb_step('float32')
    optimizer = step.gluon_trainer._optimizer
    optimizer.measure_gradients(step.params, mx.cpu())
    restored = pickle.loads(pickle.dumps(optimizer))
    assert restored.gradient_norm is None and restored.max_grad_norm == optimizer.max_grad_norm
    assert optimizer.gradient_norm is not None


def test_a_saved_lamb_state_resumes_the_same_steps():
    """Steps 1-2, the trainer's state saved and restored into a fresh step, step 3: the same weights as three
    steps without the stop (the moments, step counts and clip setting travel in the state)."""
    rng = np.random.default_rng(4)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)) for _ in range(3)]
    running = lamb_step('float32')
    running.gluon_trainer._optimizer.max_grad_norm = 0.05
    for iteration in range(2):
        running.run(batches[iteration], 0, iteration, LR)
    state = optimizer_state.trainer_state_bytes(running.gluon_trainer)
    resumed = lamb_step('float32')
    for name, param in resumed.net._collect_params_with_prefix().items():
        param.set_data(running.net._collect_params_with_prefix()[name].data())
    optimizer_state.restore_trainer_state(resumed.gluon_trainer, state)
    assert isinstance(resumed.gluon_trainer._optimizer, lamb.TimmLAMB)
    for step in (running, resumed):
        step.run(batches[2], 0, 2, LR)
    for name, param in resumed.net._collect_params_with_prefix().items():
        np.testing.assert_allclose(param.data().asnumpy(), running.net._collect_params_with_prefix()[name].data()
                                   .asnumpy(), rtol=1e-6, err_msg=name)



class HostReadLAMB(lamb.TimmLAMB):
    """--optimizer lamb as it was: the step's first update call read the global norm on the host and gave
    MXNet's kernels rescale_grad / c."""

    def _update_impl(self, index, weight, grad, state, multi_precision=False):
        if self.gradient_norm is not None:
            norm = float(self.gradient_norm.asscalar()) * self.rescale_grad
            self.host_divisor = max(1.0, norm / self.max_grad_norm)
            self.gradient_norm = None
        rescale, self.rescale_grad = self.rescale_grad, self.rescale_grad / self.host_divisor
        try:
            super()._update_impl(index, weight, grad, state, multi_precision)
        finally:
            self.rescale_grad = rescale


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
@pytest.mark.parametrize('max_norm', [10.0, 0.05])
def test_the_clip_divides_on_the_device_and_the_steps_are_those_of_the_host_read(monkeypatch, dtype, max_norm):
    """Issue 57 item 4: the step's first update call read the global gradient norm on the host, a wait for the
    device inside the update (the second of a float16 step on a GPU, rsb-a3's, whose update is otherwise queued
    before the host reads anything). Now c divides the gradients on the device: on a GPU's step (CPU contexts)
    the host reads nothing inside the update, and three steps end with the weights and optimizer state of the
    host-read order: the same bits where nothing is clipped, where every step is within the rounding of g / c in
    the gradients' dtype (float16: one rounding; float32: a few, carried over three steps), relative to each
    array's largest value."""
    rng = np.random.default_rng(2)
    batches = [batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), dtype) for _ in range(3)]
    results = []
    for optimizer_class in (lamb.TimmLAMB, HostReadLAMB):
        step = lamb_step(dtype, kind='gpu')
        optimizer = step.gluon_trainer._optimizer
        optimizer.__class__, optimizer.max_grad_norm = optimizer_class, max_norm
        reads, updating = [], []
        for name in ('asscalar', 'asnumpy', 'wait_to_read'):
            monkeypatch.setattr(mx.nd.NDArray, name, recorded(getattr(mx.nd.NDArray, name), reads, updating))
        update = step.gluon_trainer.update

        def updated(*args, **kwargs):
            updating.append(True)
            update(*args, **kwargs)
            updating.clear()
        monkeypatch.setattr(step.gluon_trainer, 'update', updated)
        for iteration, batch in enumerate(batches):
            step.run(batch, 0, iteration, LR)
        monkeypatch.undo()
        assert any(reads) == (optimizer_class is HostReadLAMB), reads
        states = step.gluon_trainer._updaters[0].states
        results.append([p.data().asnumpy() for p in step.params.values()] + [
            array.asnumpy() for index in sorted(states) for array in optimizer_state.flat_arrays(states[index])])
    rounding = 2.0 ** -11 if dtype == 'float16' else 2.0 ** -22
    for device, host in zip(*results):
        if max_norm > 1:
            np.testing.assert_array_equal(device, host)
        else:
            np.testing.assert_allclose(device, host, rtol=0, atol=rounding * np.abs(host).max())


def recorded(read, reads, updating):
    """`read` (a host read of an NDArray), noting in `reads` whether it came inside an update (`updating`)."""
    def call(array, *args, **kwargs):
        reads.append(bool(updating))
        return read(array, *args, **kwargs)
    return call
