"""augment.py: --auto-augment and --random-erase in the DALI backends. The draws follow each policy (counts
within binomial bounds, magnitudes as the policy gives them), DALI applies to each image the operation drawn for
it, the erased boxes follow torchvision's rule and hold zeros or the drawn noise, and a resumed epoch sees the
same augmentation (tests/test_data_order.py)."""
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from rn50.data import augment
from rn50.data import preset
from conftest import ROOT, resolved
from test_data import unique_label_args
from train import get_loaders


def check(args, given=frozenset()):
    """augment.check of the resolved flags `args`, as data.check_data_flags calls it."""
    augment.check(preset.TrainingPreset.of(args), args.data_backend, given, args.mode in ('train', 'train_val'))


IMAGES = 20000


def within_binomial(count, total, probability, sigmas=5):
    spread = sigmas * np.sqrt(total * probability * (1 - probability))
    return abs(count - total * probability) <= spread


def draws(policy_flags):
    policy = augment.AutoAugmentPolicy(preset.TrainingPreset.of(resolved(policy_flags)).auto_augment)
    return policy, policy.draw(np.random.default_rng(0), IMAGES)


@pytest.mark.unit
def test_trivial_augment_draws_every_operation_and_bin_uniformly():
    policy, (ops, bins, signs) = draws(['--auto-augment', 'ta_wide'])
    assert ops.shape == (IMAGES, 1) and len(policy.suite) == 14 and policy.num_bins == 31
    assert all(within_binomial(np.sum(ops == k), IMAGES, 1 / 14) for k in range(14))
    assert all(within_binomial(np.sum(bins == b), IMAGES, 1 / 31) for b in range(31))
    assert within_binomial(np.sum(signs), IMAGES, 0.5) and set(np.unique(signs)) == {0, 1}


@pytest.mark.unit
def test_rand_augment_draws_its_count_of_operations_at_its_magnitude():
    """torchvision's RandAugment by default: magnitude 7 of its 31 bins is 7/30 of each range, always applied."""
    policy, (ops, bins, _) = draws(['--auto-augment', 'ra', '--ra-num-ops', '3', '--ra-magnitude', '7'])
    assert ops.shape == (IMAGES, 3) and len(policy.suite) == 14
    np.testing.assert_allclose(bins / (policy.num_bins - 1), 7 / 30)
    # torchvision's 31 bins, not 3,001: DALI evaluates every bin of every operation as it builds a pipeline
    assert policy.num_bins == 31 and set(np.unique(bins)) == {7}
    fractional, (_, bins, _) = draws(['--auto-augment', 'ra', '--ra-magnitude', '7.25'])
    assert fractional.num_bins == 3001 and set(np.unique(bins)) == {725}
    for stage in range(3):
        assert all(within_binomial(np.sum(ops[:, stage] == k), IMAGES, 1 / 14) for k in range(14))


# timm's `rand-m6-mstd0.5-inc1` (timm/data/auto_augment.py): magnitude 6 on its scale _LEVEL_DENOM = 10, per
# application a gauss(6, 0.5) clipped to [0, 10]; each of the 2 layers one of the 15 _RAND_INCREASING_TRANSFORMS
# (with replacement), applied with AugmentOp's prob 0.5.
TIMM_LEVEL_DENOM, TIMM_MAGNITUDE, TIMM_MAGNITUDE_STD, TIMM_PROB, TIMM_LAYERS = 10, 6, 0.5, 0.5, 2
TIMM_INCREASING = ('AutoContrast', 'Equalize', 'Invert', 'Rotate', 'PosterizeIncreasing', 'SolarizeIncreasing',
                   'SolarizeAdd', 'ColorIncreasing', 'ContrastIncreasing', 'BrightnessIncreasing',
                   'SharpnessIncreasing', 'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel')
DALI_NAMES = {'AutoContrast': 'auto_contrast', 'Equalize': 'equalize', 'Invert': 'invert', 'Rotate': 'rotate',
              'PosterizeIncreasing': 'posterize', 'SolarizeIncreasing': 'solarize', 'SolarizeAdd': 'solarize_add',
              'ColorIncreasing': 'color', 'ContrastIncreasing': 'contrast', 'BrightnessIncreasing': 'brightness',
              'SharpnessIncreasing': 'sharpness', 'ShearX': 'shear_x', 'ShearY': 'shear_y',
              'TranslateXRel': 'translate_x', 'TranslateYRel': 'translate_y'}


@pytest.mark.unit
def test_rsb_a3_rand_augment_draws_what_timm_draws():
    """Per application: applied with probability 0.5, one of timm's 15 operations uniformly, at a strength of
    0.6 of its range with a spread of 0.05 (before: always applied, 0.2 of the range, no spread)."""
    policy, (ops, bins, _) = draws(['--recipe', 'rsb-a3'])
    assert ops.shape == (IMAGES, TIMM_LAYERS)
    applied = ops != policy.identity
    assert within_binomial(applied.sum(), applied.size, TIMM_PROB)
    drawn = ops[applied]
    assert sorted(policy.suite[k].name for k in np.unique(drawn)) == sorted(DALI_NAMES[n] for n in TIMM_INCREASING)
    assert all(within_binomial(np.sum(drawn == k), drawn.size, 1 / 15) for k in np.unique(drawn))
    strength = bins[applied] / (policy.num_bins - 1)
    mean, spread = TIMM_MAGNITUDE / TIMM_LEVEL_DENOM, TIMM_MAGNITUDE_STD / TIMM_LEVEL_DENOM   # clipping: 8 sd away
    assert abs(strength.mean() - mean) < 5 * spread / np.sqrt(strength.size)
    assert abs(strength.std() - spread) < 0.02 * spread
    assert len(np.unique(strength)) > 40          # the bins are fine enough for the noise


@pytest.mark.unit
def test_the_noise_is_clipped_to_the_range_and_the_probability_is_a_flag():
    policy, (ops, bins, _) = draws(['--auto-augment', 'ra', '--ra-magnitude', '9', '--ra-magnitude-scale', '10',
                                    '--ra-magnitude-std', '2', '--ra-prob', '0.25'])
    strength = bins[ops != policy.identity] / (policy.num_bins - 1)
    assert strength.min() > 0 and strength.max() == 1     # 9 + 2z clipped to 10: P(z > 0.5) = 0.3085 of them
    assert within_binomial(np.sum(strength == 1), strength.size, 0.3085)
    # torchvision's suite has an identity of its own: the operations applied are 13/14 of those drawn
    assert within_binomial(np.sum(ops != policy.identity), ops.size, 0.25 * 13 / 14)


@pytest.mark.parametrize('fraction', [0, 0.1, 0.25, 0.49, 0.5, 0.6, 0.75, 0.9, 1])
@pytest.mark.unit
def test_timms_posterize_keeps_4_down_to_0_bits(fraction):
    kept = 4 - int(fraction * 4)                  # timm's _posterize_increasing_level_to_arg
    pil_mask = ~(2 ** (8 - kept) - 1) & 0xff        # PIL's ImageOps.posterize(image, kept)
    assert augment.timm_posterize_mask(np.float32(np.linspace(0, 4, 1001)[round(fraction * 1000)])) == pil_mask


@pytest.mark.unit
def test_ra_flags_out_of_range_are_errors():
    from rn50.errors import RecipeError
    args = resolved(['--auto-augment', 'ra', '--ra-magnitude', '11', '--ra-magnitude-scale', '10'])
    with pytest.raises(RecipeError, match='above --ra-magnitude-scale 10'):
        check(args)
    for flag, value in (('--ra-prob', '1.5'), ('--ra-magnitude-std', '-1'), ('--ra-magnitude-scale', '0'),
                        ('--auto-augment-fill', '256'), ('--auto-augment-fill', '1,2'), ('--auto-augment-fill', 'x')):
        with pytest.raises(SystemExit):
            resolved(['--auto-augment', 'ra', flag, value])


@pytest.mark.unit
def test_the_fill_is_torchvisions_zero_and_rsb_a3_fills_timms_mean_colour():
    timm_mean = tuple(round(255 * m) for m in (0.485, 0.456, 0.406))    # timm's img_mean from IMAGENET_DEFAULT_MEAN
    assert fill_value(resolved(['--auto-augment', 'ta_wide'])) == 0
    assert fill_value(resolved(['--recipe', 'torchvision-v2'])) == 0
    assert fill_value(resolved(['--recipe', 'rsb-a3'])) == timm_mean == (124, 116, 104)
    assert fill_value(resolved(['--auto-augment', 'ra', '--auto-augment-fill', 'mean'])) == (124, 117, 104)
    assert fill_value(resolved(['--auto-augment', 'ra', '--auto-augment-fill', '7,7,7'])) == 7


def fill_value(args):
    """The fill of --auto-augment-fill as the training preset takes it (preset.fill_value)."""
    return preset.fill_value(args.auto_augment_fill, args.rgb_mean)


@pytest.mark.unit
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


TIMM_FLAGS = ['--ra-ops', 'timm-increasing', '--ra-magnitude', '6', '--ra-magnitude-scale', '10',
              '--ra-magnitude-std', '0.5', '--ra-prob', '0.5', '--auto-augment-fill', '124,116,104']


@pytest.mark.parametrize('flags', [['--auto-augment', 'ta_wide'],
                                   ['--auto-augment', 'ra', '--ra-num-ops', '1'],
                                   ['--auto-augment', 'ra', '--ra-num-ops', '1'] + TIMM_FLAGS,
                                   ['--auto-augment', 'imagenet']], ids=['ta_wide', 'ra', 'ra-timm', 'imagenet'])
@pytest.mark.unit
def test_each_image_gets_the_operation_drawn_for_it(tmp_path, flags):
    """Through the loader: images drawn the identity equal the images without --auto-augment (same crops),
    and the others (at bins that change an image) differ from them."""
    plain = unique_label_args(tmp_path, 'dali-cpu', count=24, batch=24)
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


# rsb-a3's RandAugment (timm's, 2 operations) on a scale of 1 (the later flags win), 101 magnitude bins: AutoGraph
# converts its operations in about 1 s, and the 1,001 of the recipe's scale of 10 in 11 to 12.5 s.
@pytest.mark.parametrize('flags', [['--auto-augment', 'ta_wide'],
                                   ['--auto-augment', 'ra'] + TIMM_FLAGS + ['--ra-magnitude-scale', '1',
                                                                            '--ra-magnitude', '0.6',
                                                                            '--ra-magnitude-std', '0.05'],
                                   ['--auto-augment', 'imagenet']], ids=['ta_wide', 'ra-timm', 'imagenet'])
@pytest.mark.unit
def test_the_operations_run_outside_autograph_and_give_its_batches(tmp_path, monkeypatch, flags):
    """AutoAugmentPolicy.apply hands DALI's select its operations wrapped in AutoGraph's do_not_convert (an rsb-a3
    pipeline built in 11 to 12.5 s of CPU before, 0.22 s after, docs/performance.md): AutoGraph converts none of
    them, nor the parameters of their magnitude bins, and an epoch's batches are those of the operations
    converted, as select runs DALI's augmentations by default."""
    from nvidia.dali import _autograph
    from nvidia.dali._autograph.impl import api
    args = unique_label_args(tmp_path, 'dali-cpu', count=24, batch=12, extra=flags)
    converted = []
    convert = api._convert_actual

    def recorded(entity, program_ctx):
        converted.append(entity.__qualname__)
        return convert(entity, program_ctx)
    monkeypatch.setattr(api, '_convert_actual', recorded)

    def epoch():
        return np.stack([batch.data[0].asnumpy() for batch in get_loaders(args, 0, 1, val=False)[0].epoch(1)])
    outside = epoch()
    assert converted and not [name for name in converted if name.startswith('Augmentation.')]
    monkeypatch.setattr(_autograph, 'do_not_convert', lambda operation: operation)
    inside = epoch()
    assert [name for name in converted if name.startswith('Augmentation.')]   # what it did before
    np.testing.assert_array_equal(outside, inside)


WARPS = {'translate_x', 'translate_y', 'shear_x', 'shear_y', 'rotate'}


@pytest.mark.parametrize('fill', ['0', '124,116,104', '9'])
@pytest.mark.unit
def test_what_a_warp_uncovers_has_the_fill_colour(tmp_path, fill):
    """Every image that a full-range translation, shear or rotation moved has pixels of exactly the fill
    colour (after normalisation): 0 is torchvision's, 124,116,104 timm's (DALI's warps take one value: a
    colour of unequal channels is filled around them); before, every fill was 128."""
    colour = np.array([float(v) for v in fill.split(',')] * (3 if ',' not in fill else 1))
    args = unique_label_args(tmp_path, 'dali-cpu', count=24, batch=24, extra=[
        '--auto-augment', 'ra', '--ra-num-ops', '1', '--ra-magnitude-scale', '1', '--ra-magnitude', '1',
        '--auto-augment-fill', fill])                           # the full range, as 30 of 30
    loader = get_loaders(args, 0, 1, val=False)[0]
    images = next(loader.epoch(1)).data[0].asnumpy()
    ops, _, _ = loader.extra_draws(1, 0, 0, 24)
    normalised = (colour - np.array(args.rgb_mean)) / np.array(args.rgb_std)
    filled = (np.abs(images - normalised[None, :, None, None]) < 1e-4).all(axis=1).mean(axis=(1, 2))
    warped = [i for i, k in enumerate(ops[:, 0]) if loader.policy.suite[k].name in WARPS]
    assert len(warped) >= 3 and all(filled[i] > 0.05 for i in warped), (warped, filled)


@pytest.mark.unit
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


@pytest.mark.parametrize('mode,dtype', [('const', 'float32'), ('const', 'float16'), ('pixel', 'float32'),
                                        ('pixel', 'float16')])
@pytest.mark.unit
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


@pytest.mark.unit
def test_an_augmentation_failure_is_not_blamed_on_the_data(tmp_path, monkeypatch):
    """A DALI error outside the decoder (here an erasing that cannot broadcast) says what DALI said, at which
    batch, and does not send the user to rebuild a dataset that is fine."""
    from rn50.errors import RecipeError
    monkeypatch.setattr(augment, 'apply_erase', lambda images, anchors, shapes, noise, size: images + anchors)
    args = unique_label_args(tmp_path, 'dali-cpu', count=8, batch=4, extra=['--random-erase', '0.5'])
    loader = get_loaders(args, 0, 1, val=False)[0]
    with pytest.raises(RecipeError) as error:
        next(loader.epoch(0))
    message = str(error.value)
    assert message.startswith('the DALI pipeline failed at batch 0 of epoch 0: Error when executing CPU operator')
    assert 'decoded' not in message and 'prepare_dataset' not in message and 'Stacktrace' not in message


@pytest.mark.parametrize('mode', ['const', 'pixel'])
@pytest.mark.parametrize('on_gpu', [False, True], ids=['dali-cpu', 'dali-gpu'])
@pytest.mark.unit
def test_every_erase_gets_float32_and_the_float16_cast_comes_after(tmp_path, monkeypatch, mode, on_gpu):
    """The graph of a float16 batch with erasing, for dali-cpu and for dali-gpu (built without a GPU; DALI
    checks devices only when a pipeline is built): crop_mirror_normalize emits float32, fn.erase takes that
    (DALI's GPU erase has no float16: dali/operators/generic/erase/erase.cu), and the cast to float16 follows.
    Before, const mode normalised straight to float16 and the GPU erase failed on batch 0."""
    from nvidia.dali import Pipeline, fn, types
    args = unique_label_args(tmp_path, 'dali-cpu', count=4, batch=4,
                             extra=['--dtype', 'float16', '--random-erase', '0.5', '--random-erase-mode', mode])
    loader = get_loaders(args, 0, 1, val=False)[0]
    loader.on_gpu = on_gpu
    calls, real = [], {name: getattr(fn, name) for name in ('crop_mirror_normalize', 'erase', 'cast')}

    def recorded(name):
        def call(*inputs, **kwargs):
            output = real[name](*inputs, **kwargs)
            calls.append((name, kwargs.get('dtype'), inputs[0], output))
            return output
        return call
    for name in real:
        monkeypatch.setattr(fn, name, recorded(name))
    with Pipeline(batch_size=4, num_threads=1, device_id=None):
        output = loader.graph(0)
    assert output.device == ('gpu' if on_gpu else 'cpu')
    assert [(name, dtype) for name, dtype, _, _ in calls] == [
        ('crop_mirror_normalize', types.FLOAT), ('erase', None), ('cast', types.FLOAT16)]
    assert calls[1][2] is calls[0][3]          # the erase's input is the normalised float32 batch


class OldDali(types.ModuleType):
    """A stand-in of a DALI before automatic augmentation (1.24), such as an older container's: pipeline_def
    hands every keyword to Pipeline(), which rejects enable_conditionals; with `conditionals`, DALI 1.23."""

    def __init__(self, version, conditionals=False):
        super().__init__('nvidia.dali')
        self.__version__ = version
        if conditionals:
            def pipeline_def(fn=None, *, enable_conditionals=False, **kwargs):
                return fn
        else:
            def pipeline_def(fn=None, **kwargs):
                if 'enable_conditionals' in kwargs:
                    raise TypeError("__init__() got an unexpected keyword argument 'enable_conditionals'")
                return fn
        self.pipeline_def = pipeline_def


@pytest.mark.parametrize('version,conditionals,lacks', [
    ('1.18.0', False, "nvidia.dali.auto_aug and pipeline_def's enable_conditionals"),
    ('1.23.0', True, 'nvidia.dali.auto_aug')])
@pytest.mark.unit
def test_auto_augment_on_a_dali_without_it_is_an_error_naming_the_version(monkeypatch, version, conditionals, lacks):
    from rn50.errors import RecipeError
    args = resolved(['--auto-augment', 'ta_wide', '--data-backend', 'dali-cpu'])
    monkeypatch.setitem(sys.modules, 'nvidia.dali', OldDali(version, conditionals))
    monkeypatch.setitem(sys.modules, 'nvidia.dali.auto_aug', None)      # import nvidia.dali.auto_aug fails
    with pytest.raises(RecipeError) as error:
        check(args)
    assert str(error.value) == (
        f'--auto-augment needs DALI 1.24 or newer (automatic augmentation, conditional pipelines) and DALI {version} '
        f'lacks {lacks}: pip install nvidia-dali-cuda110==1.34.0, the version the recipe is tested with '
        '(requirements.txt; the Dockerfile installs it)')
    check(resolved(['--auto-augment', 'ta_wide', '--data-backend', 'dali-cpu', '--mode', 'val']))  # no policy
    check(resolved(['--random-erase', '0.5', '--data-backend', 'dali-cpu']))


@pytest.mark.integration
def test_the_error_comes_before_anything_is_built(tmp_path):
    """train.py and the runner, on a DALI 1.18 (a stand-in package first on the path, whose pipeline_def
    fails): one error line, exit 2, no pipeline started."""
    package = tmp_path / 'old' / 'nvidia' / 'dali'
    package.mkdir(parents=True)
    (package.parent / '__init__.py').write_text('')
    (package / '__init__.py').write_text(
        "__version__ = '1.18.0'\n\n\ndef pipeline_def(fn=None, **kwargs):\n"
        "    raise TypeError('no pipeline may be built here')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / 'old'))
    for command in (['train.py'], ['runner', '-n', '1', '--data-root', str(tmp_path / 'none')]):
        result = subprocess.run([sys.executable, os.path.join(ROOT, command[0]), *command[1:], '--recipe', 'rsb-a3',
                                 '--data-backend', 'dali-cpu', '--workspace', str(tmp_path / 'run')],
                                capture_output=True, text=True, env=env, cwd=ROOT)
        assert result.returncode == 2, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith('error: --auto-augment needs DALI 1.24 or newer') and '1.18.0' in lines[-1]
        assert [line for line in lines if 'error' in line.lower()] == lines[-1:], lines


@pytest.mark.unit
def test_without_auto_augment_no_pipeline_asks_for_conditionals(tmp_path, monkeypatch):
    """A DALI before 1.23 runs everything but --auto-augment: with the keyword rejected, the training pipeline
    (random erasing in float16, progressive size) and the validation one build and run (before, every
    pipeline passed enable_conditionals=False and failed)."""
    import nvidia.dali
    real = nvidia.dali.pipeline_def

    def before_conditionals(fn=None, **kwargs):
        if 'enable_conditionals' in kwargs:
            raise TypeError("__init__() got an unexpected keyword argument 'enable_conditionals'")
        return real(fn, **kwargs)
    monkeypatch.setattr(nvidia.dali, 'pipeline_def', before_conditionals)
    args = unique_label_args(tmp_path, 'dali-cpu', count=8, batch=4, extra=[
        '--random-erase', '0.5', '--dtype', 'float16', '--progressive-size', '24', '--progressive-epochs', '0,1',
        '--progressive-step', '8'])
    check(args)
    train, val = get_loaders(args, 0, 1)
    assert next(train.epoch(0)).data[0].shape == (4, 3, 24, 24)
    assert next(val.epoch(0)).data[0].shape == (4, 3, 32, 32)


@pytest.mark.unit
def test_timms_rand_augment_resumes_exactly(tmp_path):
    """The noise and the probability are drawn in numpy from (seed, epoch, rank, batch) too: batches 2 and 3
    of an epoch resumed at 2 are those of the whole epoch."""
    args = unique_label_args(tmp_path, 'dali-cpu', count=16, batch=4,
                             extra=['--auto-augment', 'ra'] + TIMM_FLAGS)
    train = get_loaders(args, 0, 1, val=False)[0]
    whole = [batch.data[0].asnumpy().copy() for batch in train.epoch(3)]
    resumed = [batch.data[0].asnumpy().copy() for batch in train.epoch(3, start=2)]
    np.testing.assert_array_equal(np.stack(resumed), np.stack(whole[2:]))


@pytest.mark.unit
def test_the_container_installs_and_checks_the_dali_the_recipe_is_tested_with():
    """requirements.txt, the container's pins and this machine have one DALI; the Dockerfile installs it and
    its build fails on a DALI without automatic augmentation (before: the base image's older DALI, unchecked)."""
    import nvidia.dali
    pins = {}
    for name in ('requirements.txt', 'requirements-container.txt'):
        with open(os.path.join(ROOT, name)) as f:
            pins[name] = [line.strip() for line in f if line.startswith('nvidia-dali')]
    assert pins == {name: [f'nvidia-dali-cuda110=={augment.DALI_TESTED}'] for name in pins}
    assert nvidia.dali.__version__ == augment.DALI_TESTED
    with open(os.path.join(ROOT, 'Dockerfile')) as f:
        dockerfile = f.read()
    installs = dockerfile.index('-r requirements-container.txt')
    check = dockerfile.index('RUN python scripts/container_setup.py check')   # which calls augment.check_dali()
    assert installs < dockerfile.index('COPY . .') < check
    with open(os.path.join(ROOT, 'scripts', 'container_setup.py')) as f:
        assert 'augment.check_dali()' in f.read()
