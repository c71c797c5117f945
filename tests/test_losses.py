"""losses.py's CutMix (timm's): the pasted box is a function of the batch's position, clipped to the image, and
mixes the targets by the area pasted, in either layout; --mixup-switch-prob chooses CutMix or mixup per batch; the
training step pastes the boxes (tests/float16_twin.py's small network)."""
import mxnet as mx
import numpy as np
import pytest

from rn50.training import losses
from float16_twin import Float16Net, step_for


@pytest.mark.unit
def test_cutmix_box_is_clipped_and_targets_mixed_by_the_pasted_area():
    boxes = [tuple(losses.cutmix_boxes(1, 0, i, 0, 0, 1, 8, 6, 1.0)[0][0]) for i in range(50)]
    kept = [losses.cutmix_boxes(1, 0, i, 0, 0, 1, 8, 6, 1.0)[1][0] for i in range(50)]
    assert boxes[3] == tuple(losses.cutmix_boxes(1, 0, 3, 0, 0, 1, 8, 6, 1.0)[0][0])   # a function of the position
    assert len(set(boxes)) > 10
    for (top, bottom, left, right), share in zip(boxes, kept):
        assert 0 <= top <= bottom <= 8 and 0 <= left <= right <= 6
        assert share == pytest.approx(1 - (bottom - top) * (right - left) / 48)
    assert any(share > 0.99 for share in kept) or any(b[0] == 0 or b[1] == 8 for b in boxes)
    for layout in ('NCHW', 'NHWC'):
        images = mx.nd.array(np.arange(2).reshape(2, 1, 1, 1) * np.ones((2, 1, 4, 4)))   # image 0: 0s, 1: 1s
        if layout == 'NHWC':
            images = images.transpose((0, 2, 3, 1))
        targets = losses.smoothed_one_hot(mx.nd.array([0, 1]), 2, 0.0)
        mixed, mixed_targets = losses.mix(images, targets, np.array([0.5, 0.5], np.float32),
                                          np.array([[1, 3, 0, 4]] * 2), layout)
        first = mixed.asnumpy()[0].reshape(4, 4)
        np.testing.assert_array_equal(first, [[0] * 4, [1] * 4, [1] * 4, [0] * 4])   # rows 1-2 pasted from image 1
        np.testing.assert_allclose(mixed_targets.asnumpy(), [[0.5, 0.5], [0.5, 0.5]])


@pytest.mark.unit
def test_switch_prob_chooses_cutmix_per_batch():
    draws = [losses.cutmix_uses(1, 0, i, 0, 0, 0.3) for i in range(2000)]
    assert 0.25 < np.mean(draws) < 0.35
    assert not any(losses.cutmix_uses(1, 0, i, 0, 0, 0.0) for i in range(100))


@pytest.mark.unit
def test_training_step_pastes_boxes_with_cutmix():
    step = step_for(Float16Net(), extra=['--cutmix', '1.0', '--mixup-mode', 'batch'])
    images = mx.nd.array(np.random.default_rng(0).normal(size=(8, 4, 6, 6)))
    mixed, targets = step.inputs_and_targets(images, mx.nd.array([0, 1, 2, 0, 1, 2, 0, 1]), 0, 3, 0)
    (top, bottom, left, right), kept = (value[0] for value in losses.cutmix_boxes(1, 0, 3, 0, 0, 1, 6, 6, 1.0))
    np.testing.assert_array_equal(mixed.asnumpy()[0, :, top:bottom, left:right],
                                  images.asnumpy()[7, :, top:bottom, left:right])
    assert targets.asnumpy()[0, 0] == pytest.approx(kept * (0.9 + 0.1 / 3) + (1 - kept) * 0.1 / 3, rel=1e-5)
