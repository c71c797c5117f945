"""step.py's gradient accumulation (--grad-accum-steps): micro-batches update as one large batch, at the learning
rate of the group's first batch, and an overflow in one micro-batch skips the whole step (tests/float16_twin.py's
small networks)."""
import mxnet as mx
import numpy as np
import pytest

from rn50.training import losses
from float16_twin import Float16Net, batch_of, step_for


@pytest.mark.unit
def test_accumulated_micro_batches_update_as_one_large_batch():
    """Without batchnorm a network cannot tell 2 batches of 8 from one of 16: after each step of
    --grad-accum-steps 2 the weights equal those of batch 16, the second micro-batch alone steps, and the
    learning rate is the one of the group's first batch."""
    rng = np.random.default_rng(2)
    images, labels = rng.normal(size=(64, 4, 2, 2)), rng.integers(0, 3, 64)
    mx.random.seed(5)
    large = step_for(Float16Net(batchnorm=False), batch=16)
    mx.random.seed(5)
    small = step_for(Float16Net(batchnorm=False), batch=8, extra=['--grad-accum-steps', '2'])
    small.accumulation.start_epoch(8)
    for i in range(4):
        large.run(batch_of(images[16 * i:16 * i + 16], labels[16 * i:16 * i + 16]), 0, i, 0.5)
        before = small.net.weight.data().asnumpy().copy()
        small.run(batch_of(images[16 * i:16 * i + 8], labels[16 * i:16 * i + 8]), 0, 2 * i, 0.5)
        np.testing.assert_array_equal(small.net.weight.data().asnumpy(), before)      # no step yet
        small.run(batch_of(images[16 * i + 8:16 * i + 16], labels[16 * i + 8:16 * i + 16]), 0, 2 * i + 1, 0.5)
        np.testing.assert_allclose(small.net.weight.data().asnumpy(), large.net.weight.data().asnumpy(),
                                   rtol=1e-5, atol=1e-6)
    assert small.accumulation.group_start(5) == 4 and small.accumulation.at_step(6)


@pytest.mark.unit
def test_an_overflow_in_one_micro_batch_skips_the_whole_step():
    step = step_for(Float16Net(batchnorm=False), 'float16', extra=['--grad-accum-steps', '2'])
    step.loss_scale = losses.DynamicLossScale(scale=8.0)
    step.accumulation.start_epoch(4)
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)
    bad = images.copy()
    bad[0, 0, 0, 0] = np.inf
    before = step.net.weight.data().asnumpy().copy()
    step.run(batch_of(bad, labels, 'float16'), 0, 0, 0.5)
    step.run(batch_of(images, labels, 'float16'), 0, 1, 0.5)
    np.testing.assert_array_equal(step.net.weight.data().asnumpy(), before)
    assert step.loss_scale.skipped == 1 and step.loss_scale.scale == 4.0
    step.run(batch_of(images, labels, 'float16'), 0, 2, 0.5)                  # the zeroed sum starts clean
    step.run(batch_of(images, labels, 'float16'), 0, 3, 0.5)
    assert step.loss_scale.skipped == 1 and not np.array_equal(step.net.weight.data().asnumpy(), before)
