"""augment.py: --auto-augment and --random-erase in the DALI backends. The draws follow each policy (counts
within binomial bounds, magnitudes as the policy gives them), DALI applies to each image the operation drawn for
it, the erased boxes follow torchvision's rule and hold zeros or the drawn noise, and a resumed epoch sees the
same augmentation (tests/test_data_order.py)."""
import numpy as np
import pytest

import augment
from conftest import resolved
from test_data import unique_label_args
from train import get_loaders

IMAGES = 20000


def within_binomial(count, total, probability, sigmas=5):
    spread = sigmas * np.sqrt(total * probability * (1 - probability))
    return abs(count - total * probability) <= spread


def draws(policy_flags):
    policy = augment.Policy(resolved(policy_flags))
    return policy, policy.draw(np.random.default_rng(0), IMAGES)


def test_trivial_augment_draws_every_operation_and_bin_uniformly():
    policy, (ops, bins, signs) = draws(['--auto-augment', 'ta_wide'])
    assert ops.shape == (IMAGES, 1) and len(policy.suite) == 14 and policy.num_bins == 31
    assert all(within_binomial(np.sum(ops == k), IMAGES, 1 / 14) for k in range(14))
    assert all(within_binomial(np.sum(bins == b), IMAGES, 1 / 31) for b in range(31))
    assert within_binomial(np.sum(signs), IMAGES, 0.5) and set(np.unique(signs)) == {0, 1}


def test_rand_augment_draws_its_count_of_operations_at_its_magnitude():
    policy, (ops, bins, _) = draws(['--auto-augment', 'ra', '--ra-num-ops', '3', '--ra-magnitude', '7'])
    assert ops.shape == (IMAGES, 3) and (bins == 7).all()
    for stage in range(3):
        assert all(within_binomial(np.sum(ops[:, stage] == k), IMAGES, 1 / 14) for k in range(14))


def test_auto_augment_runs_each_sub_policy_operation_with_its_probability_at_its_magnitude():
    from nvidia.dali.auto_aug import auto_augment
    policy, (ops, bins, _) = draws(['--auto-augment', 'imagenet'])
    subs = auto_augment.get_image_net_policy(use_shape=True).sub_policies
    assert len(subs) == 25 and policy.num_bins == 11
    # each (operation, magnitude) of the policy: how often it should run over all images, and how often it ran
    # (a sub-policy of one operation does nothing in its second stage)
    for stage in range(2):
        staged = [sub[stage] for sub in subs if len(sub) > stage]
        for aug in {name for (name, _, _) in ((a.name, p, m) for a, p, m in staged)}:
            index = [a.name for a in policy.suite].index(aug)
            expected = sum(p for a, p, _ in staged if a.name == aug) / len(subs)
            ran = ops[:, stage] == index
            assert within_binomial(ran.sum(), IMAGES, expected), (stage, aug)
            assert set(np.unique(bins[ran, stage])) <= {m or 0 for a, _, m in staged if a.name == aug}, (stage, aug)
    skipped = sum(1 - p for sub in subs for _, p, _ in sub) + sum(2 - len(sub) for sub in subs)
    assert within_binomial(np.sum(ops == policy.identity), 2 * IMAGES, skipped / 50)


@pytest.mark.parametrize('name', augment.POLICIES)
def test_each_image_gets_the_operation_drawn_for_it(tmp_path, name):
    """Through the loader: images drawn the identity equal the images without --auto-augment (same crops),
    and the others (at bins that change an image) differ from them."""
    plain = unique_label_args(tmp_path, 'dali-cpu', count=24, batch=24)
    flags = ['--auto-augment', name] + (['--ra-num-ops', '1'] if name == 'ra' else [])
    auto = unique_label_args(tmp_path, 'dali-cpu', count=24, batch=24, extra=flags)
    before = next(get_loaders(plain, 0, 1, val=False)[0].epoch(1)).data[0].asnumpy()
    loader = get_loaders(auto, 0, 1, val=False)[0]
    after = next(loader.epoch(1)).data[0].asnumpy()
    ops, bins, _ = loader.extra_draws(1, 0, 0, 24)
    identity = (ops == loader.policy.identity).all(axis=1)
    changes = ~identity & (bins > 0).all(axis=1)
    assert identity.any() and changes.any()
    np.testing.assert_array_equal(after[identity], before[identity])
    for i in np.flatnonzero(changes):
        assert not np.array_equal(after[i], before[i]), (i, [loader.policy.suite[k].name for k in ops[i]])


def test_erased_boxes_follow_torchvisions_rule():
    rng = np.random.default_rng(0)
    anchors, shapes = augment.erase_boxes(rng, IMAGES, 40, 60, 0.3)
    erased = shapes[:, 0] > 0
    assert within_binomial(erased.sum(), IMAGES, 0.3 * 0.97, sigmas=6)   # a few tries of 10 never fit
    h, w = shapes[erased].T
    area = h * w / (40 * 60)
    assert area.min() >= 0.015 and area.max() <= 0.36 and (h < 40).all() and (w < 60).all()
    ratio = h / w
    assert ratio.min() >= 0.25 and ratio.max() <= 4.0 and abs(np.median(np.log(ratio))) < 0.05
    y, x = anchors[erased].T
    assert (y >= 0).all() and (x >= 0).all() and (y + h <= 40).all() and (x + w <= 60).all()
    assert (shapes[~erased] == 0).all()


@pytest.mark.parametrize('mode,dtype', [('const', 'float32'), ('pixel', 'float32'), ('pixel', 'float16')])
def test_erased_boxes_hold_zeros_or_the_drawn_noise_and_nothing_else_changes(tmp_path, mode, dtype):
    plain = unique_label_args(tmp_path, 'dali-cpu', count=12, batch=12, extra=['--dtype', dtype])
    erase = unique_label_args(tmp_path, 'dali-cpu', count=12, batch=12,
                              extra=['--dtype', dtype, '--random-erase', '0.7', '--random-erase-mode', mode])
    before = next(get_loaders(plain, 0, 1, val=False)[0].epoch(0)).data[0].asnumpy()
    loader = get_loaders(erase, 0, 1, val=False)[0]
    after = next(loader.epoch(0)).data[0].asnumpy()
    assert after.dtype == np.dtype(dtype)
    extra = loader.extra_draws(0, 0, 0, 12)
    anchors, shapes = extra[:2]
    assert 0 < (shapes[:, 0] > 0).sum() < 12
    for i, ((y, x), (h, w)) in enumerate(zip(anchors.astype(int), shapes.astype(int))):
        inside = np.zeros(before.shape[2:], bool)
        inside[y:y + h, x:x + w] = True
        np.testing.assert_array_equal(after[i][:, ~inside], before[i][:, ~inside])
        box = after[i][:, y:y + h, x:x + w]
        want = np.zeros_like(box) if mode == 'const' else extra[2][i].transpose(2, 0, 1).astype(dtype)
        np.testing.assert_array_equal(box, want)


def test_an_augmentation_failure_is_not_blamed_on_the_data(tmp_path, monkeypatch):
    """A DALI error outside the decoder (here an erasing that cannot broadcast) says what DALI said, at which
    batch, and does not send the user to rebuild a dataset that is fine."""
    from errors import RecipeError
    monkeypatch.setattr(augment, 'apply_erase', lambda images, anchors, shapes, noise, size: images + anchors)
    args = unique_label_args(tmp_path, 'dali-cpu', count=8, batch=4, extra=['--random-erase', '0.5'])
    loader = get_loaders(args, 0, 1, val=False)[0]
    with pytest.raises(RecipeError) as error:
        next(loader.epoch(0))
    message = str(error.value)
    assert message.startswith('the DALI pipeline failed at batch 0 of epoch 0: Error when executing CPU operator')
    assert 'decoded' not in message and 'prepare_dataset' not in message and 'Stacktrace' not in message
