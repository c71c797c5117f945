"""The named recipes train as their sources do (issue 36, items 10-14 and 16): mixup's draws per image, pair or
batch (--mixup-mode), MLPerf's crop area and initialisation (--init, --zero-gamma), torchvision's copy of the
weights into the average during the warm-up, timm's cosine over all epochs (--warmup-prefix 0), and the
square-root scaling of rsb-a3's learning rate with the batch; each recipe sets what its source does."""
import dataclasses
import math

import mxnet as mx
import numpy as np
import pytest

from rn50.training import ema
from rn50.nets import layers
from rn50.nets.network import Network
from rn50.training import losses
import models
from rn50.config import recipes
from rn50.optim import schedule
from conftest import digits_flags, report_gpus, runner_module, train_args, train_main
from float16_twin import Float16Net, batch_of, step_for

pytestmark = pytest.mark.unit

runner = runner_module()


def parsed(*argv):
    return train_args(list(argv))


# ---- 10. mixup's draws: per image, per pair, per batch ----------------------------------------------------------

def images_of(size=8, channels=2, side=6):
    """Image i filled with the value i, so a mixed pixel says which images it came from."""
    return mx.nd.array(np.arange(size).reshape(size, 1, 1, 1) * np.ones((size, channels, side, side)))


def test_batch_mode_draws_one_lambda_or_one_box_per_batch():
    """timm's and torchvision's default: every image of a device's batch shares one draw, mixup (one lambda)
    or CutMix (one box), and with both on each batch is one or the other (--mixup-switch-prob)."""
    kinds = set()
    for iteration in range(40):
        own, boxes = losses.mix_draws(3, 0, iteration, 0, 0, 8, 6, 6, 0.2, 1.0, 0.5, 'batch')
        assert (own == own[0]).all() and (boxes == boxes[0]).all()
        pasted = boxes[0, 1] > boxes[0, 0] and boxes[0, 3] > boxes[0, 2]
        kinds.add(bool(pasted))
        mixed, targets = losses.mix(images_of(), losses.smoothed_one_hot(mx.nd.arange(8), 8, 0.0), own, boxes)
        mixed = mixed.asnumpy()
        if pasted:
            top, bottom, left, right = boxes[0]
            assert (mixed[:, :, top:bottom, left:right] == np.arange(8)[::-1].reshape(8, 1, 1, 1)).all()
        else:
            np.testing.assert_allclose(mixed[:, 0, 0, 0], own[0] * np.arange(8) + (1 - own[0]) * np.arange(8)[::-1],
                                       rtol=1e-5)
        np.testing.assert_allclose(targets.asnumpy().diagonal(), own, rtol=1e-6)
    assert kinds == {True, False}


def test_elem_mode_keeps_the_original_per_image_lambda_and_draws_cutmix_per_image():
    """The default (the original recipe's --mixup): one lambda per image, the same draws as before; with
    CutMix each image picks mixup or CutMix and its own box; pair mode gives images i and B-1-i one draw."""
    own, boxes = losses.mix_draws(3, 1, 5, 0, 0, 8, 6, 6, 0.2, 0.0, 0.5, 'elem')
    np.testing.assert_array_equal(own, losses.mixup_weights(3, 1, 5, 0, 0, 8, 0.2))
    assert len(set(own.tolist())) == 8 and not boxes.any()
    own, boxes = losses.mix_draws(3, 1, 5, 0, 0, 64, 32, 32, 0.2, 1.0, 0.5, 'elem')
    pasted = (boxes[:, 1] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 2])
    assert 10 < pasted.sum() < 54 and len({tuple(b) for b in boxes[pasted]}) > 5
    mixed = losses.mix(images_of(64, 1, 32), losses.smoothed_one_hot(mx.nd.arange(64) % 3, 3, 0.0), own,
                       boxes)[0].asnumpy()
    for i in np.flatnonzero(pasted)[:5]:
        top, bottom, left, right = boxes[i]
        assert (mixed[i, 0, top:bottom, left:right] == 63 - i).all()
        assert (mixed[i, 0] == i).sum() == 32 * 32 - (bottom - top) * (right - left)
        assert own[i] == pytest.approx(1 - (bottom - top) * (right - left) / 32 ** 2)
    own, boxes = losses.mix_draws(3, 1, 5, 0, 0, 8, 6, 6, 0.2, 1.0, 0.5, 'pair')
    np.testing.assert_array_equal(own, own[::-1])
    np.testing.assert_array_equal(boxes, boxes[::-1])
    assert np.array_equal(own, losses.mix_draws(3, 1, 5, 0, 0, 8, 6, 6, 0.2, 1.0, 0.5, 'pair')[0])   # resumable


def test_the_training_step_mixes_per_mixup_mode_and_the_torchvision_and_timm_recipes_take_batch():
    for mode in ('elem', 'pair', 'batch'):
        step = step_for(Float16Net(), extra=['--mixup', '0.2', '--mixup-mode', mode])
        images = mx.nd.array(np.random.default_rng(0).normal(size=(8, 4, 6, 6)))
        _, targets = step.inputs_and_targets(images, mx.nd.array([0, 1, 2, 0, 1, 0, 2, 1]), 0, 3, 0)
        own = losses.mix_draws(1, 0, 3, 0, 0, 8, 6, 6, 0.2, 0.0, 0.5, mode)[0]
        on = 0.9 + 0.1 / 3
        np.testing.assert_allclose(targets.asnumpy()[[0, 1, 2], [0, 1, 2]], own[:3] * on + (1 - own[:3]) * 0.1 / 3,
                                   rtol=1e-5)
        assert len(set(own.tolist())) == {'elem': 8, 'pair': 4, 'batch': 1}[mode]
    assert parsed().mixup_mode == 'elem'
    for name in ('torchvision-v2', 'rsb-a3'):
        assert parsed('--recipe', name).mixup_mode == 'batch'
        assert parsed('--recipe', name, '--mixup-mode', 'pair').mixup_mode == 'pair'
    with pytest.raises(SystemExit):
        parsed('--mixup-mode', 'image')


# ---- 11, 12. MLPerf's crop and initialisation; zero gamma -------------------------------------------------------

def initialised(args, only, arch='resnetv15', depth=50):
    """name -> parameter of the network the flags build, each of those named `only` initialised as the recipe
    initialises it (its own initializer); the others are not drawn (a ResNet-50's He-normal weights cost a second)."""
    network = dataclasses.replace(Network.of(args), arch=arch, num_layers=depth, num_classes=1000,
                                  image_shape=(3, 32, 32), dtype='float32')
    mx.random.seed(0)
    params = {name: param for name, param in models.build(network)._collect_params_with_prefix().items()
              if only(name)}
    for param in params.values():
        param.initialize()
    return params


def is_gamma(name):
    return name.endswith('gamma')


def test_the_mlperf_recipe_starts_as_nvidias_mlperf_code():
    """MLPerf's reference and NVIDIA's run_and_time.sh crop at least 5% of the area; its MLPerfInit is MXNet's
    Xavier (gaussian, fan-in, magnitude 2) for every weight but the classifier fc1, drawn from N(0, 0.01), and
    every batchnorm gamma 1 (BNZeroInit, gamma 0 for bn3, is an option its configurations do not take)."""
    args = parsed('--recipe', 'mlperf')
    assert (args.min_random_area, args.init, args.zero_gamma) == (0.05, 'mlperf', 0)
    conv_name = 'features.stage3.unit2.body.conv2.weight'
    params = initialised(args, lambda name: name.startswith('output.') or is_gamma(name) or name == conv_name)
    classifier = params['output.weight'].data().asnumpy()
    assert classifier.std() == pytest.approx(0.01, rel=0.02) and abs(classifier.mean()) < 2e-4
    assert (params['output.bias'].data().asnumpy() == 0).all()
    assert all((p.data().asnumpy() == 1).all() for n, p in params.items() if is_gamma(n))
    conv = params[conv_name].data().asnumpy()
    assert conv.std() == pytest.approx(math.sqrt(2 / (256 * 9)), rel=0.02)       # He-normal, as before
    nvidia = initialised(parsed(), lambda name: name == 'output.weight')
    assert nvidia['output.weight'].data().asnumpy().std() == pytest.approx(math.sqrt(2 / 2048), rel=0.02)
    assert parsed('--recipe', 'mlperf', '--min-random-area', '0.08', '--init', 'nvidia').init == 'nvidia'
    assert set(layers.CLASSIFIER_INIT) == {'nvidia', 'mlperf'}


@pytest.mark.parametrize('arch,depth', [('resnetv15', 50), ('resnetv1', 18), ('xception', 50)])
def test_zero_gamma_is_a_flag_each_recipe_sets_as_its_source(arch, depth):
    """The last batchnorm of every residual unit starts at gamma 0 by default (the original recipe's, and timm's
    zero_init_last, rsb-a3); torchvision's v2 recipe (zero_init_residual False) and MLPerf start it at 1."""
    zero = {n for n, p in initialised(parsed(), is_gamma, arch, depth).items()
            if is_gamma(n) and (p.data().asnumpy() == 0).all()}
    assert zero and all(n.endswith(('final_bn.gamma', 'bn2.gamma', 'bn3.gamma')) for n in zero)
    ones = initialised(parsed('--zero-gamma', '0'), is_gamma, arch, depth)
    assert all((p.data().asnumpy() == 1).all() for n, p in ones.items() if is_gamma(n))
    expected = {'nvidia': 1, 'mlperf': 0, 'torchvision-v2': 0, 'rsb-a3': 1}
    assert {name: parsed('--recipe', name).zero_gamma for name in recipes.RECIPES} == expected
    with pytest.raises(SystemExit):
        parsed('--zero-gamma', '2')


# ---- 13. torchvision's average copies the weights during the warm-up --------------------------------------------

def test_the_adjusted_average_copies_the_weights_through_the_warm_up_as_torchvision():
    """--model-ema-adjust with 1 warm-up epoch of 4 steps, an update every 2 steps: torchvision resets its
    average's count after each update of a warm-up epoch, so the updates after steps 2, 4 (in the warm-up) and
    6 (the first after it) copy the weights; from step 8 on they average. A function of the step: resumable."""
    mx.random.seed(1)
    step = step_for(Float16Net())
    step.average = ema.WeightAverage(step.net, 0.9, mx.cpu(), every=2, decay_per_update=0.5, copy_epochs=1.0)
    step.accumulation.start_epoch(4)
    rng = np.random.default_rng(0)
    previous = None
    for number in range(1, 11):
        epoch, iteration = divmod(number - 1, 4)
        step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8)), epoch, iteration, 0.5)
        weights = {n: p.data().asnumpy() for n, p in step.net._collect_params_with_prefix().items()}
        average = {n: a.asnumpy() for n, a in step.average.average.items()}
        if number in (2, 4, 6):
            for name in weights:
                np.testing.assert_array_equal(average[name], weights[name])
        elif number in (8, 10):
            for name in weights:
                np.testing.assert_allclose(average[name], 0.5 * previous[name] + 0.5 * weights[name], rtol=1e-5,
                                           atol=1e-7)
        if number % 2 == 0:
            previous = average
    assert [ema.copies_weights(s, 2, 4, 1.0) for s in (2, 4, 6, 8, 10)] == [True, True, True, False, False]
    assert [ema.copies_weights(s, 32, 10, 2.5) for s in (32, 64)] == [True, False]    # 25 steps of warm-up
    assert not ema.copies_weights(64, 32, 10, 0.0) and ema.copies_weights(32, 32, 10, 0.0)


# ---- 14. rsb-a3's cosine over all epochs --------------------------------------------------------------------

def test_without_warmup_prefix_the_cosine_spans_every_epoch_as_timms():
    """timm's CosineLRScheduler (warmup_prefix False): the cosine is a function of the epoch from 0 to the end,
    the warm-up replaces its first part; with the prefix (the default) it spans the epochs after the warm-up."""
    def lr(progress, prefix, kind='cosine'):
        return schedule.learning_rate(progress, 1.0, 100, 5, kind, warmup_prefix=prefix)
    assert lr(50, False) == pytest.approx(0.5)
    assert lr(50, True) == pytest.approx(0.5 * (1 + math.cos(math.pi * 45 / 95)))
    assert lr(5, False) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.05))) and lr(5, True) == 1.0
    assert lr(2.5, False) == lr(2.5, True) == 0.5 and lr(100, False) == 0.0
    assert lr(52.5, False, 'poly') == pytest.approx(0.0001 + (1 - 0.0001) * 0.475 ** 2)
    assert parsed().warmup_prefix == 1 and parsed('--recipe', 'rsb-a3').warmup_prefix == 0
    assert parsed('--recipe', 'rsb-a3').drop_path == 0.0     # A3 has no stochastic depth (A1 and A2: 0.05)


# ---- 16. rsb-a3's learning rate at another batch ----------------------------------------------------------------

def runner_lr(monkeypatch, capsys, argv):
    report_gpus(monkeypatch, 0)
    assert runner.main(argv + ['--dry-run']) == 0
    out, err = capsys.readouterr()
    words = out.split()
    return float(words[words.index('--lr') + 1]), err


def test_rsb_a3_scales_its_learning_rate_by_the_square_root_of_the_batch_as_timm(monkeypatch, capsys):
    """timm's lr_base_scale: 'sqrt' for optimizers named ada* or *lamb*, so A3's 8e-3 at 2,048 images is
    8e-3 x sqrt(32 / 2048) = 1e-3 at 32 (linearly it was 1.25e-4); the runner and train.py's own resolution
    agree, and the runner says which rule it took. The linear recipes keep theirs."""
    lr, err = runner_lr(monkeypatch, capsys, ['-n', '1', '-b', '32', '--recipe', 'rsb-a3'])
    assert lr == pytest.approx(1e-3)
    assert 'runner: --recipe rsb-a3: --lr 0.001 is -l 0.00282843 per 256 images scaled by the square root' in err
    assert runner_lr(monkeypatch, capsys, ['-n', '8', '--recipe', 'rsb-a3'])[0] == pytest.approx(8e-3)
    lr, _ = runner_lr(monkeypatch, capsys, ['-n', '1', '-b', '32', '--recipe', 'rsb-a3', '--grad-accum-steps', '4'])
    assert lr == pytest.approx(8e-3 * math.sqrt(128 / 2048))
    assert parsed('--recipe', 'rsb-a3', '--batch-size', '32').lr == pytest.approx(1e-3)
    lr, err = runner_lr(monkeypatch, capsys, ['-n', '1', '-b', '50', '--recipe', 'mlperf'])
    assert lr == pytest.approx(11.0 * 50 / 3200) and 'scaled linearly with the batch' in err
    assert parsed('--recipe', 'torchvision-v2', '--batch-size', '256').lr == pytest.approx(0.125)
    assert 'runner: --recipe' not in runner_lr(monkeypatch, capsys, ['-n', '1', '-b', '32'])[1]


def test_train_py_logs_the_rule_a_recipes_learning_rate_took(digits, tmp_path, caplog):
    """train.py resolving --lr from the recipe says so in its log (reading one validation batch is enough, in
    this process: one epoch of it, not the recipe's 100, each abandoning a DALI epoch after its first batch; a
    native thread crashed the test process after those once, under pytest-xdist)."""
    result = train_main(*digits_flags(digits, 32), '--recipe', 'rsb-a3', '--test-io', '--test-io-mode', 'val',
                        '--benchmark-iters', '1', '--num-epochs', '1', '--num-layers', '10', '--val-image-shape',
                        '3,32,32', '--workspace', tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    log = (tmp_path / 'log.log').read_text()
    assert ('Recipe rsb-a3 scales its learning rate (0.008 at 2048 images) by the square root of the batch ratio '
            "(timm's rule for LAMB): 0.001 at 32 images a step; --lr 0.001\n") in log
    # through the runner, which passes --lr (its scaling of -l): the recipe's rate, not "given"; and one given
    import train
    from rn50.config import resolve
    for lr, said in (('0.001', '; --lr 0.001'), ('0.002', "; --lr 0.002 (given: not the recipe's)")):
        args, origin = resolve.from_command(train.build_parser(), ['--recipe', 'rsb-a3', '--batch-size', '32',
                                                                   '--lr', lr, '--data-backend', 'synthetic'])
        caplog.clear()
        with caplog.at_level('INFO', logger='rn50.config.resolve'):
            resolve.log_derived(args, origin)
        assert [r.getMessage() for r in caplog.records if 'scales its learning rate' in r.getMessage()][0] \
            .endswith(said)
