"""--optimizer lars (lars.py) against MLPerf's LARS written out here: one step of the recipe's TrainingStep, each
parameter: weights of 2+ dimensions get lr x eta x ||w|| / (||g|| + wd x ||w|| + eps) with weight decay and
momentum, 1-dimensional ones (batchnorm gamma/beta, biases) plain SGD without weight decay; float32 and the
float16 twin (float32 master weights)."""
import mxnet as mx
import numpy as np
import pytest

import losses
from float16_twin import Float16Net, batch_of, step_for

ETA, EPS, WD, LR = 0.02, 1e-6, 0.01, 0.5


def expected_after_one_step(before, grad):
    """The LARS update from zero momentum, in float64."""
    if before.ndim > 1:
        w_norm, g_norm = np.linalg.norm(before), np.linalg.norm(grad)
        trust = ETA * w_norm / (g_norm + WD * w_norm + EPS) if w_norm > 0 and g_norm > 0 else 1.0
        return before - LR * trust * (grad + WD * before)
    return before - LR * grad


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
def test_one_lars_step_of_every_parameter_follows_the_formula(dtype):
    mx.random.seed(3)
    step = step_for(Float16Net(), dtype, extra=['--optimizer', 'lars', '--lars-eta', str(ETA), '--lars-eps', str(EPS),
                                                '--wd', str(WD), '--mom', '0.9', '--label-smoothing', '0'])
    if step.loss_scale is not None:   # float16: a scale whose gradients fit (the default overflows this tiny net)
        step.loss_scale = losses.DynamicLossScale(scale=8.0)
    params = {name: p for name, p in step.net._collect_params_with_prefix().items() if p.grad_req != 'null'}
    before = {name: p.data().asnumpy().astype(np.float64) for name, p in params.items()}
    rng = np.random.default_rng(1)
    step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), dtype), 0, 0, LR)
    optimizer = step.gluon_trainer._optimizer
    assert type(optimizer).__name__ == 'MLPerfLARS' and optimizer.momentum == 0.9
    for name, param in params.items():
        grad = param.grad().asnumpy().astype(np.float64) * optimizer.rescale_grad
        want = expected_after_one_step(before[name], grad)
        got = param.data().asnumpy().astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == 'float16' else 1e-5, atol=1e-6, err_msg=name)
        assert not np.allclose(got, before[name])     # every trained parameter moved
    assert {name for name in params if params[name].data().ndim > 1} == {'weight'}
