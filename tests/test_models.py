"""models.py: parameter counts, shapes, stride placement, initialisation, weight decay, fusion, layouts,
float16, export."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

import models
from errors import RecipeError


def trainable(net):
    return sum(int(np.prod(p.shape)) for p in net.collect_params().values() if p.grad_req != 'null')


def built(net, shape=(1, 3, 32, 32)):
    net.initialize()
    net(mx.nd.zeros(shape))
    return net


def resnet_count(num_layers, num_classes=1000, in_channels=3, groups=1, width_per_group=None):
    """Trainable parameters of a ResNet/ResNeXt from its architecture table (conv weights + BN gamma/beta +
    FC), computed independently of models.py."""
    kind, blocks = models.RESNET_DEPTHS[num_layers]
    total = 7 * 7 * in_channels * 64 + 2 * 64
    channels = 64
    outs = [64, 128, 256, 512] if kind == 'basic' else [256, 512, 1024, 2048]
    for stage, (n, out) in enumerate(zip(blocks, outs)):
        for i in range(n):
            if kind == 'basic':
                total += 9 * channels * out + 2 * out + 9 * out * out + 2 * out
            else:
                width = groups * width_per_group * 2 ** stage if width_per_group else out // 4
                total += channels * width + 2 * width + 9 * width * width // groups + 2 * width
                total += width * out + 2 * out
            if channels != out or (stage > 0 and i == 0):
                total += channels * out + 2 * out
            channels = out
    return total + channels * num_classes + num_classes


@pytest.mark.parametrize('depth,known', [(18, 11689512), (34, 21797672), (50, 25557032), (101, 44549160),
                                         (152, 60192808)])
def test_resnet_parameter_counts(depth, known):
    assert resnet_count(depth) == known
    for arch in ('resnetv1', 'resnetv15'):
        assert trainable(built(models.get_model(arch, depth))) == known


def test_four_channel_stem_and_resnext_counts():
    assert trainable(built(models.get_model(image_shape=(4, 224, 224)), (1, 4, 32, 32))) == 25560168
    assert resnet_count(50, groups=32, width_per_group=4) == 25028904
    for arch in ('resnextv1', 'resnextv15'):
        assert trainable(built(models.get_model(arch, 50, num_groups=32))) == 25028904
    assert trainable(built(models.get_model('resnextv15', 101))) == resnet_count(101, groups=32,
                                                                                  width_per_group=4)


def test_xception_count_and_shape():
    # entry 3x3 convs (32, 64) + 12 blocks of separable convs + exit (1536, 2048) + FC, with BN gamma/beta:
    # 22,855,952 trainable parameters for 1000 classes (Keras' Xception has 22,855,952 as well, with 299 px).
    net = built(models.get_model('xception'), (2, 3, 64, 64))
    assert trainable(net) == 22855952
    assert net(mx.nd.zeros((2, 3, 64, 64))).shape == (2, 1000)


@pytest.mark.parametrize('arch', models.ARCHITECTURES)
def test_output_shapes(arch):
    net = built(models.get_model(arch, 50 if 'resnext' in arch else 18, num_classes=7))
    out = net(mx.nd.random.uniform(shape=(3, 3, 32, 32)))
    assert out.shape == (3, 7) and out.dtype == np.float32


def first_downsampling_bottleneck(net):
    stage2_first = [b for b in net.features._children.values() if isinstance(b, models.Residual)][3]
    return [(layer._kwargs['kernel'], layer._kwargs['stride']) for layer in stage2_first.body._children.values()
            if isinstance(layer, gluon.nn.Conv2D)]


def test_stride_placement_v1_versus_v15():
    assert first_downsampling_bottleneck(models.get_model('resnetv1')) == [((1, 1), (2, 2)), ((3, 3), (1, 1)),
                                                                           ((1, 1), (1, 1))]
    assert first_downsampling_bottleneck(models.get_model('resnetv15')) == [((1, 1), (1, 1)), ((3, 3), (2, 2)),
                                                                            ((1, 1), (1, 1))]


def test_initialisation_zero_gamma_and_he_normal():
    net = built(models.get_model(num_layers=50, num_classes=10))
    params = net._collect_params_with_prefix()
    final = [n for n in params if n.endswith('final_bn.gamma')]
    assert len(final) == 16 and all((params[n].data() == 0).asnumpy().all() for n in final)
    assert (params['features.1.gamma'].data() == 1).asnumpy().all()
    assert (params['output.0.bias'].data() == 0).asnumpy().all()
    stem = params['features.0.weight'].data().asnumpy()
    assert stem.std() == pytest.approx(np.sqrt(2 / (3 * 7 * 7)), rel=0.05)


def test_no_weight_decay_on_batchnorm_and_bias():
    net = built(models.get_model(num_layers=18, num_classes=10))
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 1.0, 'wd': 0.1})
    before = {n: p.data().copy() for n, p in net._collect_params_with_prefix().items() if p.grad_req != 'null'}
    with mx.autograd.record():
        zero = (net(mx.nd.ones((2, 3, 32, 32))) * 0).sum()     # fresh, all-zero gradients
    zero.backward()
    trainer.step(1)
    after = net._collect_params_with_prefix()
    for name, old in before.items():
        changed = not np.array_equal(after[name].data().asnumpy(), old.asnumpy())
        decays = name.endswith('weight')
        assert changed == (decays and bool(old.abs().sum().asscalar() > 0)), name


@pytest.mark.parametrize('arch', ['resnetv15', 'xception'])
def test_fused_and_unfused_give_same_outputs(arch, tmp_path):
    plain = built(models.get_model(arch, 18, num_classes=10))
    fused = models.get_model(arch, 18, num_classes=10, fuse_bn_relu=True, fuse_bn_add_relu=True)
    path = str(tmp_path / 'w.params')
    plain.save_parameters(path)
    fused.load_parameters(path)     # same parameter names
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    np.testing.assert_allclose(fused(x).asnumpy(), plain(x).asnumpy(), rtol=1e-4, atol=1e-5)
    with mx.autograd.record():
        training_outputs = fused(x), plain(x)
    np.testing.assert_allclose(training_outputs[0].asnumpy(), training_outputs[1].asnumpy(), rtol=1e-4,
                               atol=1e-5)


def test_nhwc_input_with_nchw_convolutions_matches(tmp_path):
    nchw = built(models.get_model(num_layers=18, num_classes=10))
    nhwc_input = models.get_model(num_layers=18, num_classes=10, input_layout='NHWC')
    path = str(tmp_path / 'w.params')
    nchw.save_parameters(path)
    nhwc_input.load_parameters(path, allow_missing=False)
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    np.testing.assert_allclose(nhwc_input(x.transpose((0, 2, 3, 1))).asnumpy(), nchw(x).asnumpy(), rtol=1e-5,
                               atol=1e-6)


def test_nhwc_builds_on_gpu_and_is_refused_on_cpu():
    net = models.get_model(conv_layout='NHWC', batchnorm_layout='NHWC', pooling_layout='NHWC', device='gpu')
    transposes = [b for b in net.features._children.values() if isinstance(b, models.Transpose)]
    assert isinstance(net.input_transpose, models.Transpose) and not transposes   # one, before the stem
    with pytest.raises(RecipeError, match='NHWC convolution and pooling on GPU only'):
        models.get_model(conv_layout='NHWC', device='cpu')


def test_clear_errors():
    with pytest.raises(RecipeError, match='depths'):
        models.get_model(num_layers=42)
    with pytest.raises(RecipeError, match='bottleneck'):
        models.get_model('resnextv15', 34)
    with pytest.raises(RecipeError, match='3 channels'):
        models.get_model(image_shape=(1, 32, 32))
    if not models.fused_ops_available()['nvidia_bn_relu']:
        with pytest.raises(RecipeError, match='--fuse-bn-relu 0'):
            models.get_model(fuse_bn_relu=True, device='gpu')
    if not models.fused_ops_available()['nvidia_bn_add_relu']:
        with pytest.raises(RecipeError, match='--fuse-bn-add-relu 0'):
            models.get_model(fuse_bn_add_relu=True, device='gpu')


def test_float16_keeps_batchnorm_float32_and_returns_float32():
    net = models.get_model(num_layers=18, num_classes=10, dtype='float16')
    net.initialize()
    params = net._collect_params_with_prefix()
    assert np.dtype(params['features.0.weight'].dtype) == np.float16
    assert np.dtype(params['features.1.gamma'].dtype) == np.float32
    assert np.dtype(params['features.1.running_var'].dtype) == np.float32
    assert np.dtype(params['output.0.weight'].dtype) == np.float16
    # MXNet's CPU backend has no float16 convolution (oneDNN): the forward pass is a GPU-only check.
    if mx.context.num_gpus():
        out = net.as_in_context(mx.gpu())(mx.nd.zeros((1, 3, 32, 32), ctx=mx.gpu(), dtype='float16'))
        assert out.dtype == np.float32


@pytest.mark.parametrize('arch', ['resnetv15', 'resnextv1', 'xception'])
def test_hybridize_export_import_round_trip(arch, tmp_path):
    net = built(models.get_model(arch, 50 if 'resnext' in arch else 18, num_classes=10))
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.uniform(shape=(2, 3, 32, 32))
    expected = net(x).asnumpy()
    net.export(str(tmp_path / 'net'))
    imported = gluon.SymbolBlock.imports(str(tmp_path / 'net-symbol.json'), ['data'],
                                         str(tmp_path / 'net-0000.params'))
    np.testing.assert_allclose(imported(x).asnumpy(), expected, rtol=1e-5, atol=1e-6)
