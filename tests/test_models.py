"""models.py: parameter counts, shapes, stride placement, initialisation, weight decay, fused kernels, layouts,
float16, 4-channel stem, export/import, and the errors a user can get.

Parameter counts come from the declared shapes, checked against MXNet's shape inference on a tiny input
(no big forward passes); the expected counts are computed here from the architecture tables, independently
of models.py, and the well-known ones are also asserted literally."""
import argparse
import dataclasses

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from rn50.nets import layers
from rn50.nets.network import Network
import models
from conftest import in_fresh_process, random_weights, resolved, train_args
from rn50.errors import RecipeError

pytestmark = pytest.mark.unit

# --------------------------------------------------------------------------------------------------------
# Helpers

RESNET_TABLE = {18: ('basic', [2, 2, 2, 2]), 34: ('basic', [3, 4, 6, 3]), 50: ('bottleneck', [3, 4, 6, 3]),
                101: ('bottleneck', [3, 4, 23, 3]), 152: ('bottleneck', [3, 8, 36, 3])}


def expected_resnet_count(num_layers, num_classes=1000, in_channels=3, groups=1, width_per_group=None):
    """Conv weights + batchnorm gamma/beta + dense weight and bias of a ResNet (or, with width_per_group, a
    ResNeXt) from its table."""
    bn = lambda channels: 2 * channels  # noqa: E731
    kind, units = RESNET_TABLE[num_layers]
    outs = [64, 128, 256, 512] if kind == 'basic' else [256, 512, 1024, 2048]
    total = 7 * 7 * in_channels * 64 + bn(64)
    channels = 64
    for stage, (count, out) in enumerate(zip(units, outs)):
        width = groups * width_per_group * 2 ** stage if width_per_group else out // 4
        for unit in range(count):
            if kind == 'basic':
                total += 9 * channels * out + bn(out) + 9 * out * out + bn(out)
            else:
                total += channels * width + bn(width) + 9 * (width // groups) * width + bn(width) + width * out + bn(out)
            if channels != out or (stage > 0 and unit == 0):
                total += channels * out + bn(out)          # projection shortcut
            channels = out
    return total + channels * num_classes + num_classes


def expected_xception_count(num_classes=1000, in_channels=3):
    """Entry convs, 12 blocks of separable convs (depthwise 3x3 + pointwise 1x1, each followed by batchnorm),
    1x1 projections on the 4 downsampling blocks, exit separable convs 1536 and 2048, dense."""
    separable = lambda cin, cout: 9 * cin + cin * cout + 2 * cout   # noqa: E731  (with its batchnorm)
    total = 9 * in_channels * 32 + 2 * 32 + 9 * 32 * 64 + 2 * 64
    blocks = [([128, 128], True), ([256, 256], True), ([728, 728], True)] + [([728] * 3, False)] * 8 + \
             [([728, 1024], True)]
    channels = 64
    for widths, downsample in blocks:
        block_in = channels
        for width in widths:
            total += separable(channels, width)
            channels = width
        if downsample:
            total += block_in * channels + 2 * channels
    return total + separable(1024, 1536) + separable(1536, 2048) + 2048 * num_classes + num_classes


def trainable_count(net, input_shape=(1, 3, 32, 32)):
    """Trainable parameters, after MXNet's shape inference on a tiny input agreed with the declared shapes."""
    net.infer_shape(mx.nd.zeros(input_shape))
    return sum(int(np.prod(p.shape)) for p in net.collect_params().values() if p.grad_req != 'null')


def blocks_of(block, kind):
    """Every block of type `kind` in the tree under `block`, in order."""
    found = [block] if isinstance(block, kind) else []
    for child in block._children.values():
        found += blocks_of(child, kind)
    return found


def copy_weights(source, target, tmp_path):
    """source's weights into target through save/load_parameters (strict: every name must match)."""
    path = str(tmp_path / 'weights.params')
    source.save_parameters(path)
    target.load_parameters(path)
    return target


def images(shape=(2, 3, 32, 32), seed=1):
    return mx.nd.array(np.random.RandomState(seed).normal(size=shape))


def assert_close(actual, expected, rtol=1e-4):
    """Equal up to float32 reordering: relative to the largest magnitude of `expected`."""
    actual, expected = [a.asnumpy() if isinstance(a, mx.nd.NDArray) else a for a in (actual, expected)]
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


# --------------------------------------------------------------------------------------------------------
# Flags


def test_model_flags():
    parser = argparse.ArgumentParser()
    group = models.add_model_args(parser)
    assert group.title == 'Model'
    args = parser.parse_args([])
    # --num-classes: None until train.py's parser resolves it from the dataset (tests/test_classes.py)
    assert (args.arch, args.num_layers, args.num_groups, args.num_classes) == ('resnetv15', 50, 32, None)
    assert (args.batchnorm_eps, args.batchnorm_mom, args.fuse_bn_relu, args.fuse_bn_add_relu) == (1e-5, 0.9, 0, 0)
    with pytest.raises(SystemExit):
        parser.parse_args(['--fuse-bn-relu', '2'])


def test_the_network_record_holds_the_resolved_flags():
    """Network.of: every Model flag, the layouts, the input shape and the dtype of the resolved flags, as values
    (booleans, a tuple); a teacher's or export's `dataclasses.replace` changes only what it names."""
    args = resolved(['--data-backend', 'synthetic', '--arch', 'resnextv1', '--num-layers', '101', '--num-groups', '8',
                     '--num-classes', '7', '--fuse-bn-relu', '1', '--batchnorm-eps', '2e-5', '--batchnorm-mom', '0.8',
                     '--input-layout', 'NHWC', '--batchnorm-layout', 'NHWC', '--image-shape', '4,64,64',
                     '--dtype', 'float32', '--drop-path', '0.1', '--init', 'mlperf', '--zero-gamma', '0',
                     '--mode', 'train'])
    network = Network.of(args)
    assert network == Network(arch='resnextv1', num_layers=101, num_classes=7, num_groups=8, batchnorm_eps=2e-5,
                              batchnorm_mom=0.8, fuse_bn_relu=True, fuse_bn_add_relu=False, input_layout='NHWC',
                              conv_layout='NCHW', batchnorm_layout='NHWC', pooling_layout='NCHW',
                              image_shape=(4, 64, 64), dtype='float32', drop_path=0.1, init='mlperf',
                              zero_gamma=False)
    assert type(network.fuse_bn_relu) is bool and type(network.zero_gamma) is bool
    with pytest.raises(dataclasses.FrozenInstanceError):
        network.arch = 'resnetv1'
    teacher = dataclasses.replace(network, arch='resnetv15', num_layers=18, drop_path=0.0)
    portable = dataclasses.replace(network, dtype='float32', conv_layout='NCHW', batchnorm_layout='NCHW',
                                   pooling_layout='NCHW', fuse_bn_relu=False, fuse_bn_add_relu=False,
                                   image_shape=(3, 64, 64))
    for other, named in ((teacher, {'arch', 'num_layers', 'drop_path'}),
                         (portable, {'fuse_bn_relu', 'batchnorm_layout', 'image_shape'})):   # the others: as given
        changed = {field.name for field in dataclasses.fields(Network)
                   if getattr(other, field.name) != getattr(network, field.name)}
        assert changed == named
    # What a resume must keep are fields, under the flags' names (fit.RESUMED_SETTINGS takes them)
    assert set(Network.RESUMED) <= {field.name for field in dataclasses.fields(Network)} <= set(vars(args))
    assert Network() == Network.of(resolved(['--data-backend', 'synthetic', '--mode', 'val', '--drop-path', '0.1']))


# --------------------------------------------------------------------------------------------------------
# Parameter counts


@pytest.mark.parametrize('depth,known', [(18, 11689512), (34, 21797672), (50, 25557032), (101, 44549160),
                                         (152, 60192808)])
def test_resnet_parameter_counts(depth, known):
    assert expected_resnet_count(depth) == known
    assert trainable_count(models.get_model('resnetv1', depth)) == known
    assert trainable_count(models.get_model('resnetv15', depth)) == known


@pytest.mark.parametrize('depth,groups,known', [(50, 32, 25028904), (101, 32, 44177704), (152, 32, None),
                                                (50, 8, None)])
def test_resnext_parameter_counts(depth, groups, known):
    expected = expected_resnet_count(depth, groups=groups, width_per_group=4)
    assert known is None or expected == known
    for arch in ('resnextv1', 'resnextv15'):
        assert trainable_count(models.get_model(arch, depth, num_groups=groups)) == expected


def test_xception_parameter_count():
    # 22,855,952: the formula above; Keras' Xception has the same structure (bias-free convolutions, a
    # batchnorm after each, projections on the four downsampling blocks) and reports the same trainable count.
    assert expected_xception_count() == 22855952
    assert trainable_count(models.get_model('xception')) == 22855952
    assert trainable_count(models.get_model('xception', num_classes=10)) == expected_xception_count(10)


def test_four_channel_stem_counts_and_computes_like_three_channels(tmp_path):
    assert trainable_count(models.get_model(image_shape=(4, 224, 224)), (1, 4, 32, 32)) == 25560168
    assert 25560168 - 25557032 == 64 * 7 * 7 == expected_resnet_count(50, in_channels=4) - expected_resnet_count(50)
    three = random_weights(models.get_model(num_layers=18, num_classes=10))
    four = random_weights(models.get_model(num_layers=18, num_classes=10, image_shape=(4, 32, 32)), seed=5)
    for name, param in three._collect_params_with_prefix().items():
        if name == 'features.conv0.weight':
            stem = four._collect_params_with_prefix()[name].data()
            stem[:, :3] = param.data()                 # the 4th input plane keeps its own random weights
        else:
            four._collect_params_with_prefix()[name].set_data(param.data())
    x = images()
    padded = mx.nd.concat(x, mx.nd.zeros((2, 1, 32, 32)), dim=1)   # what the loaders feed: a zero 4th channel
    assert_close(four(padded), three(x))


# --------------------------------------------------------------------------------------------------------
# Structure


@pytest.mark.parametrize('arch,depth', [('resnetv1', 18), ('resnetv15', 34), ('resnextv1', 50), ('resnextv15', 50),
                                        ('xception', 50)])
def test_output_shapes(arch, depth):
    net = random_weights(models.get_model(arch, depth, num_classes=7))
    for shape in [(3, 3, 32, 32), (1, 3, 40, 56)]:
        out = net(images(shape))
        assert out.shape == (shape[0], 7) and out.dtype == np.float32
        assert np.isfinite(out.asnumpy()).all()


def conv_strides(block):
    return {name: (layer._kwargs['kernel'], layer._kwargs['stride']) for name, layer in block._children.items()
            if isinstance(layer, gluon.nn.Conv2D)}


def test_stride_placement_v1_versus_v15():
    v1 = models.get_model('resnetv1').features
    v15 = models.get_model('resnetv15').features
    assert conv_strides(v1['stage2']['unit1'].body) == {'conv1': ((1, 1), (2, 2)), 'conv2': ((3, 3), (1, 1)),
                                                        'conv3': ((1, 1), (1, 1))}
    assert conv_strides(v15['stage2']['unit1'].body) == {'conv1': ((1, 1), (1, 1)), 'conv2': ((3, 3), (2, 2)),
                                                         'conv3': ((1, 1), (1, 1))}
    for features in (v1, v15):   # the projection shortcut is the same in both, and later units never stride
        assert conv_strides(features['stage2']['unit1'].shortcut) == {'conv': ((1, 1), (2, 2))}
        assert all(stride == (1, 1) for _, stride in conv_strides(features['stage2']['unit2'].body).values())
        assert conv_strides(features['stage1']['unit1'].body)['conv2'] == ((3, 3), (1, 1))
    resnext = models.get_model('resnextv15', num_groups=32).features
    assert resnext['stage2']['unit1'].body['conv2']._kwargs['num_group'] == 32
    assert resnext['stage2']['unit1'].body['conv2']._channels == 256     # 32 groups x 4 x 2


# --------------------------------------------------------------------------------------------------------
# Initialisation and weight decay


def last_batchnorm_of_every_body(arch, depth):
    """Structural names of the batchnorms whose gamma starts at 0, from the architecture tables."""
    if arch == 'xception':
        widths = [2, 2, 2] + [3] * 8 + [2]
        return {f'features.block{b + 1}.body.bn{n}.gamma' for b, n in enumerate(widths)}
    return {f'features.stage{s + 1}.unit{u + 1}.final_bn.gamma'
            for s, units in enumerate(RESNET_TABLE[depth][1]) for u in range(units)}


@pytest.mark.parametrize('arch,depth', [('resnetv15', 50), ('resnetv1', 18), ('resnextv15', 50), ('xception', 50)])
def test_initialisation_zero_gamma_and_he_normal(arch, depth):
    net = models.get_model(arch, depth, num_classes=10)
    net.initialize()       # no initializer argument: every parameter brings its own
    params = net._collect_params_with_prefix()
    gammas = {n: p.data().asnumpy() for n, p in params.items() if n.endswith('gamma')}
    zero = {n for n, g in gammas.items() if (g == 0).all()}
    assert zero == last_batchnorm_of_every_body(arch, depth)
    assert all((g == 1).all() for n, g in gammas.items() if n not in zero)
    weights = 0
    for name, param in params.items():
        value = param.data().asnumpy()
        if name.endswith(('beta', 'running_mean', 'bias')):
            assert (value == 0).all(), name
        elif name.endswith('running_var'):
            assert (value == 1).all(), name
        elif name.endswith('weight') and value.size >= 8000:   # enough samples for a 5% std check
            weights += 1
            fan_in = np.prod(value.shape[1:])      # per group for grouped and depthwise convolutions
            assert abs(value.mean()) < 0.05 * np.sqrt(2 / fan_in), name
            assert value.std() == pytest.approx(np.sqrt(2 / fan_in), rel=0.05), name
    assert weights >= 15


def test_no_weight_decay_on_batchnorm_and_biases():
    net = random_weights(models.get_model(num_layers=18, num_classes=10))
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 1.0, 'wd': 0.1})
    params = {n: p for n, p in net._collect_params_with_prefix().items() if p.grad_req != 'null'}
    before = {n: p.data().asnumpy() for n, p in params.items()}
    with mx.autograd.record():
        loss = (net(images()) * 0).sum()       # backward gives every parameter a zero gradient
    loss.backward()
    assert all((p.grad().asnumpy() == 0).all() for p in params.values())
    trainer.step(1)
    exempt = [n for n in params if n.endswith(('gamma', 'beta', 'bias'))]
    assert len(exempt) == 2 * 20 + 1            # 20 batchnorms (17 in the body, 3 projections) and the dense bias
    for name, param in params.items():
        after = param.data().asnumpy()
        if name in exempt:
            np.testing.assert_array_equal(after, before[name], err_msg=name)
        else:                                   # SGD: w <- w - lr * (grad + wd * w) = 0.9 w
            np.testing.assert_allclose(after, 0.9 * before[name], rtol=1e-6, err_msg=name)


# --------------------------------------------------------------------------------------------------------
# Fused kernels


@pytest.mark.skipif(not layers.fused_ops_available()['onednn_bn_relu'], reason='no oneDNN BatchNormWithReLU')
@pytest.mark.parametrize('arch,depth', [('resnetv15', 50), ('xception', 50)])
def test_fused_and_unfused_compute_the_same(arch, depth, tmp_path):
    plain = random_weights(models.get_model(arch, depth, num_classes=10))
    fused = models.get_model(arch, depth, num_classes=10, fuse_bn_relu=True, fuse_bn_add_relu=True)
    assert {b.kernel for b in blocks_of(fused, layers.BatchNormReLU)} == {'onednn'}
    assert list(fused.collect_params()) == list(plain.collect_params())   # Gluon names as well as structural
    copy_weights(plain, fused, tmp_path)
    x = images()
    assert_close(fused(x), plain(x))
    outputs, grads = [], []
    for net in (fused, plain):                 # training mode: batch statistics, and the backward pass
        with mx.autograd.record():
            out = net(x)
            loss = (out * mx.nd.arange(10)).sum()
        loss.backward()
        outputs.append(out.asnumpy())
        grads.append(net._collect_params_with_prefix()['features.conv1.weight' if arch == 'xception'
                                                       else 'features.conv0.weight'].grad().asnumpy())
    assert_close(outputs[0], outputs[1])
    assert_close(grads[0], grads[1], rtol=1e-3)


def test_fused_requests_this_mxnet_cannot_honour(monkeypatch):
    monkeypatch.setattr(layers, 'fused_ops_available', lambda: {'nvidia_bn_relu': False,
                                                                'nvidia_bn_add_relu': False,
                                                                'onednn_bn_relu': False})
    for flag in ('fuse_bn_relu', 'fuse_bn_add_relu'):
        with pytest.raises(RecipeError, match='NVIDIA.*pass --fuse-bn-relu 0 --fuse-bn-add-relu 0'):
            models.get_model(device='gpu', **{flag: True})
    with pytest.raises(RecipeError, match='oneDNN.*pass --fuse-bn-relu 0'):
        models.get_model(fuse_bn_relu=True, device='cpu')
    models.get_model(fuse_bn_add_relu=True, device='cpu')    # composed in one block: nothing to refuse
    monkeypatch.setattr(layers, 'fused_ops_available', lambda: {'nvidia_bn_relu': True,
                                                                'nvidia_bn_add_relu': True,
                                                                'onednn_bn_relu': True})
    with pytest.raises(RecipeError, match='NCHW only'):
        models.get_model(fuse_bn_relu=True, batchnorm_layout='NHWC', device='cpu')
    net = models.get_model(fuse_bn_relu=True, fuse_bn_add_relu=True, device='gpu', conv_layout='NHWC',
                           batchnorm_layout='NHWC', pooling_layout='NHWC')
    assert {b.kernel for b in blocks_of(net, layers.BatchNormReLU)} == {'nvidia'}
    assert {b.kernel for b in blocks_of(net, layers.BatchNormAddReLU)} == {'nvidia'}


class NvidiaKernels:
    """CPU stand-ins for the operators of NVIDIA's MXNet build, with its signatures: BatchNorm takes an
    act_type, BatchNormAddRelu does not. Each records the keywords it gets and computes with stock ops."""

    def __init__(self):
        self.calls = []
        self.batchnorm = mx.nd.BatchNorm

    def BatchNorm(self, x, gamma, beta, mean, var, act_type=None, **kwargs):
        self.calls.append(('BatchNorm', dict(kwargs, act_type=act_type)))
        out = self.batchnorm(x, gamma, beta, mean, var, **kwargs)
        return mx.nd.Activation(out, act_type=act_type) if act_type else out

    def BatchNormAddRelu(self, data, addend, gamma, beta, moving_mean, moving_var, **kwargs):
        if 'act_type' in kwargs:
            raise TypeError("BatchNormAddRelu() got an unexpected keyword argument 'act_type'")
        self.calls.append(('BatchNormAddRelu', kwargs))
        out = self.batchnorm(data, gamma, beta, moving_mean, moving_var, **kwargs)
        return mx.nd.Activation(out + addend, act_type='relu')


@pytest.mark.parametrize('stored_act_type', ['absent', None, 'relu'])
def test_nvidia_fused_blocks_whatever_batchnorm_kwargs_hold(monkeypatch, stored_act_type):
    """NVIDIA's build keeps act_type in nn.BatchNorm._kwargs: the fused blocks must neither pass it twice nor
    hand it to BatchNormAddRelu, and must compute what the composed blocks compute."""
    kernels = NvidiaKernels()
    monkeypatch.setattr(mx.nd, 'BatchNorm', kernels.BatchNorm)
    monkeypatch.setattr(mx.nd, 'BatchNormAddRelu', kernels.BatchNormAddRelu, raising=False)
    x, addend = images((2, 4, 3, 3), seed=1) - 0.5, images((2, 4, 3, 3), seed=2) - 0.5
    for cls, inputs in ((layers.BatchNormReLU, (x,)), (layers.BatchNormAddReLU, (x, addend))):
        blocks = [cls(kernel, in_channels=4) for kernel in ('nvidia', 'composed')]
        for block in blocks:
            block.initialize()
            rng = np.random.RandomState(3)
            for param in (block.gamma, block.beta, block.running_mean, block.running_var):
                param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, param.shape)))
            if stored_act_type != 'absent':
                block._kwargs['act_type'] = stored_act_type
        kernels.calls.clear()
        fused = blocks[0](*inputs)
        name, kwargs = kernels.calls[0]
        if cls is layers.BatchNormReLU:
            assert name == 'BatchNorm' and kwargs['act_type'] == 'relu'
        else:
            assert name == 'BatchNormAddRelu' and 'act_type' not in kwargs
        assert {k: v for k, v in kwargs.items() if k != 'act_type'} == \
            dict(name='fwd', **{k: v for k, v in blocks[0]._kwargs.items() if k != 'act_type'})
        kernels.calls.clear()
        composed = blocks[1](*inputs)
        assert [call[1]['act_type'] for call in kernels.calls] == [None]   # a plain BatchNorm, then the ReLU
        assert_close(fused, composed)
        assert fused.min() >= 0 and (fused == 0).sum() > 0


def test_capability_probe_matches_the_installed_mxnet():
    available = layers.fused_ops_available()
    assert available['nvidia_bn_add_relu'] == hasattr(mx.nd, 'BatchNormAddRelu')
    assert available['onednn_bn_relu'] == (mx.runtime.Features().is_enabled('MKLDNN') and
                                           hasattr(mx.nd.contrib, 'BatchNormWithReLU'))
    if not available['nvidia_bn_relu']:       # stock MXNet: the op rejects act_type, as the probe says
        with pytest.raises(mx.base.MXNetError):
            mx.nd.BatchNorm(mx.nd.ones((1, 2, 2, 2)), *[mx.nd.ones(2)] * 4, act_type='relu')


# --------------------------------------------------------------------------------------------------------
# Layouts


def test_nhwc_input_with_nchw_layers_matches_nchw(tmp_path):
    nchw = random_weights(models.get_model(num_layers=50, num_classes=10))
    nhwc_input = models.get_model(num_layers=50, num_classes=10, input_layout='NHWC')
    transposes = blocks_of(nhwc_input, layers.Transpose)
    assert [(t.source, t.target) for t in transposes] == [('NHWC', 'NCHW')]
    assert nhwc_input.features['conv0_transpose'] is transposes[0]        # right before the stem
    copy_weights(nchw, nhwc_input, tmp_path)
    x = images()
    assert_close(nhwc_input(x.transpose((0, 2, 3, 1))), nchw(x))


@pytest.mark.parametrize('arch', ['resnetv15', 'xception'])
@in_fresh_process
def test_mixed_layouts_on_cpu_match_nchw(arch, tmp_path):
    """NHWC batchnorm and pooling between NCHW convolutions: transposes in both branches of every block."""
    nchw = random_weights(models.get_model(arch, 18, num_classes=10))
    mixed = models.get_model(arch, 18, num_classes=10, input_layout='NHWC', batchnorm_layout='NHWC',
                             pooling_layout='NHWC')
    assert all(bn._kwargs['axis'] == 3 for bn in blocks_of(mixed, gluon.nn.BatchNorm))
    assert len(blocks_of(mixed, layers.Transpose)) > 20
    copy_weights(nchw, mixed, tmp_path)
    x = images()
    assert_close(mixed(x.transpose((0, 2, 3, 1))), nchw(x))


def test_gpu_nhwc_network_has_one_transpose_before_the_stem():
    net = models.get_model(conv_layout='NHWC', batchnorm_layout='NHWC', pooling_layout='NHWC', device='gpu',
                           image_shape=(4, 224, 224))
    transposes = blocks_of(net, layers.Transpose)
    assert [(t.source, t.target) for t in transposes] == [('NCHW', 'NHWC')]
    assert list(net.features._children)[:2] == ['conv0_transpose', 'conv0']
    assert all(conv._kwargs['layout'] == 'NHWC' for conv in blocks_of(net, gluon.nn.Conv2D))
    assert all(bn._kwargs['axis'] == 3 for bn in blocks_of(net, gluon.nn.BatchNorm))
    assert net.features['conv0'].weight.shape == (64, 7, 7, 4)
    assert trainable_count(net, (1, 4, 32, 32)) == 25560168      # shape inference only: no NHWC conv runs
    assert not blocks_of(models.get_model('xception', input_layout='NHWC', conv_layout='NHWC',
                                          batchnorm_layout='NHWC', pooling_layout='NHWC', device='gpu'),
                         layers.Transpose)


# --------------------------------------------------------------------------------------------------------
# float16


def test_float16_parameters_names_and_float32_logits():
    float32 = models.get_model(num_layers=18, num_classes=10)
    net = models.get_model(num_layers=18, num_classes=10, dtype='float16')
    assert list(net._collect_params_with_prefix()) == list(float32._collect_params_with_prefix())
    assert list(net.collect_params()) == list(float32.collect_params())
    net.initialize()
    for name, param in net._collect_params_with_prefix().items():
        is_batchnorm = name.endswith(('gamma', 'beta', 'running_mean', 'running_var'))
        assert param.data().dtype == (np.float32 if is_batchnorm else np.float16), name
    # MXNet 1.9.1 has no float16 convolution or dense layer on the CPU ("FP16 gemm on cpu not implemented"),
    # so here the graph is checked by type inference; a GPU runs it.
    graph = net(mx.sym.var('data'))
    arg_types, out_types, aux_types = graph.infer_type(data='float16')
    assert out_types == [np.float32]
    assert set(aux_types) == {np.float32}
    if mx.context.num_gpus():
        net.reset_ctx(mx.gpu())
        out = net(images().astype('float16').as_in_context(mx.gpu()))
        assert out.dtype == np.float32 and out.shape == (2, 10)


# --------------------------------------------------------------------------------------------------------
# Hybridize, export, import


@pytest.mark.parametrize('arch,depth,fused', [('resnetv1', 18, False), ('resnetv15', 34, True),
                                              ('resnextv1', 50, False), ('resnextv15', 50, False),
                                              ('xception', 50, False)])
def test_hybridize_export_import_round_trip(arch, depth, fused, tmp_path):
    fused = fused and layers.fused_ops_available()['onednn_bn_relu']
    net = random_weights(models.get_model(arch, depth, num_classes=10, fuse_bn_relu=fused, fuse_bn_add_relu=fused))
    x = images()
    imperative = net(x).asnumpy()
    net.hybridize(static_alloc=True, static_shape=True)
    hybridized = net(x).asnumpy()
    assert_close(hybridized, imperative)
    net.export(str(tmp_path / 'net'))
    imported = gluon.SymbolBlock.imports(str(tmp_path / 'net-symbol.json'), ['data'],
                                         str(tmp_path / 'net-0000.params'))
    assert_close(imported(x), hybridized, rtol=1e-6)     # the same graph and weights


# --------------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize('options,message', [
    (dict(conv_layout='NHWC'), 'NHWC convolutions on GPU only.*--conv-layout NCHW'),
    (dict(arch='resnextv15', num_layers=34), 'ResNeXt.*50, 101 and 152'),
    (dict(arch='resnextv1', num_layers=18), 'ResNeXt.*50, 101 and 152'),
    (dict(num_layers=42), '--num-layers 42.*10, 18, 34, 50, 101, 152'),
    (dict(arch='resnextv15', num_groups=0), '--num-groups 0'),
    (dict(arch='resnet50'), '--arch resnet50'),
    (dict(image_shape=(1, 32, 32)), '--image-shape 1,32,32'),
    (dict(num_classes=0), '--num-classes 0'),
    (dict(dtype='bfloat16'), '--dtype bfloat16'),
    (dict(input_layout='NWHC'), '--input-layout NWHC'),
    (dict(batchnorm_mom=1.5), '--batchnorm-mom 1.5'),
])
def test_clear_errors(options, message):
    with pytest.raises(RecipeError, match=message):
        models.get_model(**options)


def test_nhwc_pooling_and_batchnorm_are_allowed_on_cpu_but_not_convolution():
    models.get_model(batchnorm_layout='NHWC', pooling_layout='NHWC', device='cpu')
    models.get_model(conv_layout='NHWC', device='gpu')
    with pytest.raises(RecipeError):
        models.get_model(conv_layout='NHWC', batchnorm_layout='NHWC', pooling_layout='NHWC', device='cpu')


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
def test_stochastic_depth_drops_whole_samples_of_the_body_in_training_only(dtype):
    """--drop-path in a residual unit's last block: in training each sample's batchnorm output is either
    dropped (relu(shortcut)) or scaled by 1 / (1 - rate), about `rate` of the samples dropped; in inference
    the plain relu(batchnorm(x) + shortcut). Float16 too (the float16 twin of a GPU run)."""
    rate, count = 0.4, 4000
    block = layers.BatchNormAddReLU('composed', rate, in_channels=3)
    block.initialize()
    block.gamma.set_data(mx.nd.array([1.5, 0.5, 2.0]))
    block.beta.set_data(mx.nd.array([0.3, -0.2, 0.1]))
    rng = np.random.default_rng(0)
    x = mx.nd.array(rng.normal(size=(count, 3, 2, 2)), dtype=dtype)
    shortcut = mx.nd.array(rng.normal(size=(count, 3, 2, 2)), dtype=dtype)
    if dtype == 'float16':
        block.cast('float16')
    with mx.autograd.record(train_mode=True):
        trained = block(x, shortcut).asnumpy().astype(np.float64)
    inference = block(x, shortcut).asnumpy().astype(np.float64)
    with mx.autograd.record(train_mode=True):    # normalised with the batch's statistics
        normalised = mx.nd.BatchNorm(x.astype('float32'), block.gamma.data().astype('float32'),
                                     block.beta.data().astype('float32'), mx.nd.zeros(3),
                                     mx.nd.ones(3), fix_gamma=False, eps=1e-5).asnumpy().astype(np.float64)
    plain = np.maximum(0, shortcut.asnumpy().astype(np.float64))
    kept = np.maximum(0, normalised / (1 - rate) + shortcut.asnumpy())
    tolerance = dict(atol=2e-2, rtol=1e-2) if dtype == 'float16' else dict(atol=1e-4)
    dropped = np.array([np.allclose(t, p, **tolerance) and not np.allclose(t, k, **tolerance)
                        for t, p, k in zip(trained, plain, kept)])
    assert all(np.allclose(t, k, **tolerance) for t, k in zip(trained[~dropped], kept[~dropped]))
    assert abs(dropped.mean() - rate) < 5 * np.sqrt(rate * (1 - rate) / count)
    running = mx.nd.BatchNorm(x.astype('float32'), block.gamma.data().astype('float32'),
                              block.beta.data().astype('float32'), block.running_mean.data(),
                              block.running_var.data(), fix_gamma=False, eps=1e-5,
                              use_global_stats=True).asnumpy()
    np.testing.assert_allclose(inference, np.maximum(0, running + shortcut.asnumpy()), **tolerance)


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
def test_stochastic_depth_keeps_the_fused_kernel_and_computes_the_same(monkeypatch, dtype):
    """--drop-path with NVIDIA's BatchNormAddRelu: the unit stays one fused operator (gamma and beta scaled by 1 /
    (1 - rate) for the kept samples, relu(shortcut) for the dropped ones) instead of falling back to three
    (BatchNorm, Dropout, add + ReLU). With the same draws it gives the composed unit's outputs, gradients and
    running statistics, in training and inference (CPU stand-ins of NVIDIA's operators)."""
    kernels = NvidiaKernels()
    monkeypatch.setattr(mx.nd, 'BatchNorm', kernels.BatchNorm)
    monkeypatch.setattr(mx.nd, 'BatchNormAddRelu', kernels.BatchNormAddRelu, raising=False)
    rate = 0.3
    rng = np.random.default_rng(4)
    x = mx.nd.array(rng.normal(size=(64, 3, 2, 2)), dtype=dtype)
    shortcut = mx.nd.array(rng.normal(size=(64, 3, 2, 2)), dtype=dtype)
    head = mx.nd.array(rng.normal(size=(64, 3, 2, 2)), dtype=dtype)    # the gradient of the output
    results = []
    for kernel in ('nvidia', 'composed'):
        block = layers.BatchNormAddReLU(kernel, rate, in_channels=3)
        block.initialize()
        block.gamma.set_data(mx.nd.array([1.5, 0.5, 2.0]))
        block.beta.set_data(mx.nd.array([0.3, -0.2, 0.1]))
        if dtype == 'float16':
            block.cast('float16')
        inputs = [x.copy(), shortcut.copy()]
        for array in inputs:
            array.attach_grad()
        mx.random.seed(11)
        kernels.calls.clear()
        with mx.autograd.record(train_mode=True):
            out = block(*inputs)
        out.backward(head)
        assert [name for name, _ in kernels.calls] == (['BatchNormAddRelu'] if kernel == 'nvidia' else ['BatchNorm'])
        results.append([out, *(a.grad for a in inputs), block.gamma.grad(), block.beta.grad(),
                        block.running_mean.data(), block.running_var.data(), block(*inputs)])
    dropped = (results[1][0].asnumpy() == np.maximum(0, shortcut.asnumpy())).all(axis=(1, 2, 3))
    assert 0.1 < dropped.mean() < 0.5      # the same draws dropped about `rate` of the samples in both
    tolerance = dict(atol=2e-2, rtol=1e-2) if dtype == 'float16' else dict(atol=1e-5, rtol=1e-5)
    for fused, composed in zip(*results):
        np.testing.assert_allclose(fused.asnumpy().astype(np.float64), composed.asnumpy().astype(np.float64),
                                   **tolerance)


def test_stochastic_depth_rises_linearly_over_the_units_and_leaves_inference_networks_alone():
    net = models.get_model(num_layers=50, num_classes=10, image_shape=(3, 32, 32), drop_path=0.15)
    rates = [block.drop_rate for block in blocks_of(net, layers.BatchNormAddReLU)]
    np.testing.assert_allclose(rates, np.linspace(0, 0.15, 16))
    assert sorted(net._collect_params_with_prefix()) == sorted(models.get_model(
        num_layers=50, num_classes=10, image_shape=(3, 32, 32))._collect_params_with_prefix())
    resnext = models.get_model('resnextv15', num_layers=50, num_classes=10, drop_path=0.2)
    assert [b.drop_rate for b in blocks_of(resnext, layers.BatchNormAddReLU)][-1] == pytest.approx(0.2)
    for mode, expected in (('train', 0.1), ('train_val', 0.1), ('val', 0.0), ('pred', 0.0), ('export', 0.0)):
        args = train_args(['--drop-path', '0.1', '--mode', mode])
        assert Network.of(args).drop_path == expected, mode
    with pytest.raises(RecipeError, match='not --arch xception'):
        models.get_model('xception', drop_path=0.1)
