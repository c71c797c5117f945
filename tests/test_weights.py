"""weight_loading.py, weight_origins.py, weight_conversion.py: reading .params/.safetensors/.npz, recognising
every supported origin, converting it to this recipe's network with the same logits, and the errors a user can
get.

The foreign dictionaries are written from a float32 NCHW network's weights by tests/checkpoint_formats.py,
which renames and transposes as foreign-weights.md documents, independently of weight_origins.py; GluonCV's own
resnet*_v1b networks are built and run. Networks are small (ResNet-18/50 on 32x32 images, batch 2)."""
import argparse
import json
import struct

import mxnet as mx
import numpy as np
import pytest

import checkpoint_formats as formats
from rn50.checkpoints import weight_loading
import data
from rn50 import errors
import models
from rn50.checkpoints import weight_conversion, weight_origins
from conftest import allocated, random_weights, randomise_batchnorm
from rn50.errors import RecipeError

pytestmark = pytest.mark.unit

# --------------------------------------------------------------------------------------------------------
# Helpers


def float16_exact(net):
    """Rounds convolution and dense weights to float16 values, so that a float16 copy converts back exactly."""
    for name, param in net._collect_params_with_prefix().items():
        if name.endswith(('weight', 'bias')):
            param.set_data(param.data().astype('float16').astype('float32'))
    return net


def reference_net(depth, classes=1000, seed=0, **options):
    return float16_exact(random_weights(models.get_model(num_layers=depth, num_classes=classes, **options), seed))


def load(net, params):
    """`params` into `net` (initialised if needed; every parameter first set to NaN, so that one left out
    would show in the logits)."""
    if not net._collect_params_with_prefix()['output.weight']._data:
        allocated(net)
    for name, param in net._collect_params_with_prefix().items():
        param.set_data(mx.nd.full(param.shape, np.nan, dtype=param.dtype))
        if name in params:
            assert params[name].shape == param.shape and params[name].dtype == np.dtype(param.dtype), name
            param.set_data(mx.nd.array(params[name], dtype=param.dtype))
    return net


def images(shape=(2, 3, 32, 32), seed=1):
    return mx.nd.array(np.random.RandomState(seed).normal(size=shape))


def assert_close(actual, expected, tol=1e-4):
    """Equal within 1e-4, relative to the largest logit (float32 sums in another order)."""
    actual, expected = [a.asnumpy() if isinstance(a, mx.nd.NDArray) else a for a in (actual, expected)]
    assert np.isfinite(actual).all()
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * np.abs(expected).max())


def shapes_only(net, dtype=np.float32):
    """name -> zero-stride arrays of the network's shapes (no memory, no initialisation)."""
    return {name: np.broadcast_to(np.zeros((), dtype), param.shape)
            for name, param in net._collect_params_with_prefix().items()}


def save_params(arrays, path):
    mx.nd.save(str(path), {name: mx.nd.array(value, dtype=value.dtype) for name, value in arrays.items()})
    return path


@pytest.fixture(scope='module')
def reference():
    """depth -> (float32 NCHW network with float16-exact weights, its logits on `images()`)."""
    nets = {}

    def get(depth):
        if depth not in nets:
            net = reference_net(depth)
            nets[depth] = net, net(images()).asnumpy()
        return nets[depth]
    return get


@pytest.fixture(scope='module')
def gluoncv():
    module = formats.gluoncv_resnetv1b()
    assert module is not None, 'gluoncv is not installed: make setup installs gluoncv==0.10.5.post0 --no-deps'
    return module


# --------------------------------------------------------------------------------------------------------
# The original NVIDIA recipe


NVIDIA_VARIANTS = {'float32': dict(), 'float32-fused': dict(fused=True), 'float16': dict(float16=True),
                   'float16-fused': dict(float16=True, fused=True)}


@pytest.mark.parametrize('variant', NVIDIA_VARIANTS)
@pytest.mark.parametrize('depth', [18, 50])
def test_nvidia_checkpoints_give_the_same_logits(depth, variant, reference, tmp_path):
    net, logits = reference(depth)
    options = NVIDIA_VARIANTS[variant]
    arrays = formats.nvidia_arrays(formats.recipe_arrays(net), **options)
    float16 = options.get('float16', False)
    if float16:
        assert arrays['_net.features.0.1.weight'].shape == (64, 7, 7, 4)
        assert arrays['_net.output.weight'].dtype == np.float16
    path = save_params(arrays, tmp_path / 'model_best.params')
    arrays = weight_loading.read_arrays(path)
    origin = weight_origins.recognise(arrays)
    assert (origin.kind, origin.depth, origin.fused, origin.num_classes) == ('nvidia', depth,
                                                                             options.get('fused', False), 1000)
    assert (origin.layout, origin.stem_channels, origin.dtype) == (
        ('OHWI', 4, 'float16') if float16 else ('OIHW', 3, 'float32'))
    target = models.get_model(num_layers=depth)
    params, description = weight_conversion.convert(arrays, target, source=str(path))
    assert description.startswith(f"{path}: NVIDIA's original recipe ResNet-{depth}") and '\n' not in description
    if float16:
        assert "dropped the stem's 4th input channel" in description and 'OHWI->OIHW' in description
        assert 'float16->float32' in description
    assert_close(load(target, params)(images()), logits)


@pytest.mark.parametrize('depth', [10, 18, 34, 50, 101, 152])
def test_every_depth_is_recognised(depth):
    net = models.get_model(num_layers=depth)
    recipe = shapes_only(net)
    for arrays, kind in [(recipe, 'recipe'), (formats.nvidia_arrays(recipe), 'nvidia'),
                         (formats.nvidia_arrays(recipe, float16=True, fused=True), 'nvidia'),
                         (formats.torch_style_arrays(recipe), 'gluoncv'),
                         (formats.torch_style_arrays(recipe, torchvision=True), 'torchvision'),
                         ({'module.' + n: v for n, v in formats.torch_style_arrays(recipe, torchvision=True).items()},
                          'torchvision')]:                          # DataParallel's prefix
        origin = weight_origins.recognise(arrays)
        assert (origin.kind, origin.depth, origin.arch) == (kind, depth, f'ResNet-{depth}')
        assert {t for t in origin.names.values() if t} == set(recipe)      # every weight has its place


# --------------------------------------------------------------------------------------------------------
# GluonCV and torchvision/timm


def gluoncv_net(module, name, seed=0):
    mx.random.seed(seed)
    net = getattr(module, name)()
    net.initialize(mx.init.Xavier(magnitude=2))
    net(images())                           # deferred shapes
    randomise_batchnorm(net, seed)
    return net


@pytest.mark.parametrize('name,depth', [('resnet50_v1b', 50), ('resnet18_v1b', 18)])
def test_gluoncv_v1b_gives_the_same_logits(name, depth, gluoncv, tmp_path):
    net = gluoncv_net(gluoncv, name)
    logits = net(images()).asnumpy()
    net.save_parameters(str(tmp_path / f'{name}.params'))
    arrays = weight_loading.read_arrays(tmp_path / f'{name}.params')
    assert 'layer1.0.conv1.weight' in arrays and 'bn1.gamma' in arrays        # GluonCV's own names
    origin = weight_origins.recognise(arrays)
    assert (origin.kind, origin.depth) == ('gluoncv', depth)
    target = models.get_model(num_layers=depth)
    params, description = weight_conversion.convert(arrays, target)
    assert 'GluonCV ResNet-' in description
    assert_close(load(target, params)(images()), logits)


@pytest.mark.parametrize('suffix', ['.safetensors', '.npz'])
def test_torchvision_names_in_safetensors_and_npz_give_the_same_logits(suffix, gluoncv, tmp_path):
    from safetensors.numpy import save_file
    net = gluoncv_net(gluoncv, 'resnet50_v1b', seed=3)
    logits = net(images()).asnumpy()
    state = formats.to_torchvision({n: p.data().asnumpy() for n, p in net._collect_params_with_prefix().items()})
    assert state['bn1.weight'].shape == (64,) and state['layer1.0.bn3.num_batches_tracked'].dtype == np.int64
    path = tmp_path / f'model{suffix}'
    save_file(state, str(path)) if suffix == '.safetensors' else np.savez(path, **state)
    arrays = weight_loading.read_arrays(path)
    assert set(arrays) == set(state)
    origin = weight_origins.recognise(arrays)
    assert (origin.kind, origin.depth, origin.num_classes) == ('torchvision', 50, 1000)
    target = models.get_model(num_layers=50)
    params, _ = weight_conversion.convert(arrays, target)
    assert_close(load(target, params)(images()), logits)


# --------------------------------------------------------------------------------------------------------
# This recipe's own checkpoints in other layouts


GPU_LAYOUT = dict(conv_layout='NHWC', batchnorm_layout='NHWC', pooling_layout='NHWC', dtype='float16',
                  device='gpu', image_shape=(4, 32, 32))


def test_own_gpu_checkpoint_converts_to_cpu_float32_and_back(reference, tmp_path):
    net, logits = reference(50)
    recipe = formats.recipe_arrays(net)
    # float32 NCHW 3-channel -> the GPU network (NHWC, 4-channel stem, float16), built by shape inference only
    gpu = models.get_model(num_layers=50, **GPU_LAYOUT)
    params, description = weight_conversion.convert(recipe, gpu)
    for name, param in gpu._collect_params_with_prefix().items():
        assert params[name].shape == param.shape and params[name].dtype == np.dtype(param.dtype), name
    stem = params['features.conv0.weight']
    np.testing.assert_array_equal(stem[..., :3], recipe['features.conv0.weight'].transpose(0, 2, 3, 1))
    assert (stem[..., 3] == 0).all() and stem.dtype == np.float16
    np.testing.assert_array_equal(params['features.stage2.unit1.body.conv2.weight'],
                                  recipe['features.stage2.unit1.body.conv2.weight'].transpose(0, 2, 3, 1))
    assert params['features.bn0.gamma'].dtype == np.float32
    assert 'zero-padded the stem to 4 input channels' in description and 'OIHW->OHWI' in description
    allocated(gpu)
    for name, param in gpu._collect_params_with_prefix().items():
        param.set_data(mx.nd.array(params[name], dtype=param.dtype))     # the network accepts every array
    gpu.save_parameters(str(tmp_path / 'model_best.params'))

    # the GPU checkpoint -> float32 NCHW, 3 channels: the same logits
    arrays = weight_loading.read_arrays(tmp_path / 'model_best.params')
    origin = weight_origins.recognise(arrays)
    assert (origin.kind, origin.layout, origin.stem_channels, origin.dtype) == ('recipe', 'OHWI', 4, 'float16')
    cpu = models.get_model(num_layers=50)
    params, description = weight_conversion.convert(arrays, cpu)
    assert "dropped the stem's 4th input channel" in description
    assert_close(load(cpu, params)(images()), logits)
    # ... and into a float32 NCHW network with a 4-channel stem fed a zero 4th channel
    four = models.get_model(num_layers=50, image_shape=(4, 32, 32))
    params, _ = weight_conversion.convert(arrays, four)
    x = mx.nd.concat(images(), mx.nd.zeros((2, 1, 32, 32)), dim=1)
    assert_close(load(four, params)(x), logits)


def test_nhwc_input_network_runs_converted_weights(reference):
    """A network with NHWC input and pooling (which run on the CPU) gives the same logits from converted
    float16 OHWI weights. Not NHWC batchnorm here: in MXNet 1.9.1 (oneDNN) a BatchNorm with axis 3 aborts the
    process ("terminate called without an active exception") once an NCHW network of the same sizes has run
    in it, as the reference network has."""
    net, logits = reference(18)
    mixed = models.get_model(num_layers=18, input_layout='NHWC', pooling_layout='NHWC')
    params, _ = weight_conversion.convert(formats.nvidia_arrays(formats.recipe_arrays(net), float16=True), mixed)
    assert_close(load(mixed, params)(images().transpose((0, 2, 3, 1))), logits)


# --------------------------------------------------------------------------------------------------------
# A new classifier


def test_new_classifier_converts_everything_else(reference):
    net, _ = reference(18)
    arrays = formats.nvidia_arrays(formats.recipe_arrays(net), fused=True)
    ten = models.get_model(num_layers=18, num_classes=10)
    with pytest.raises(RecipeError, match='1000-class classifier, the network 10 classes: pass --num-classes 1000'
                                          '.*new classifier'):
        weight_conversion.convert(arrays, ten)
    params, description = weight_conversion.convert(arrays, ten, new_classifier=True)
    assert set(params) == set(ten._collect_params_with_prefix()) - {'output.weight', 'output.bias'}
    assert 'classifier left out for a new one (1000 -> 10 classes)' in description
    load(ten, params)
    ten.output.initialize(force_reinit=True)
    assert_close(ten.features(images()), net.features(images()))


# --------------------------------------------------------------------------------------------------------
# Mismatches


def infer_shapes(net, shape=(1, 3, 32, 32)):
    net.infer_shape(mx.nd.zeros(shape))
    return shapes_only(net)


@pytest.mark.parametrize('case,message', [
    ('depth', r"NVIDIA's original recipe ResNet-18 weights: the network is a ResNet-50: pass --num-layers 18"),
    ('gluoncv-deep-stem', r'deep stem.*v1c/v1d.*different network from ResNet v1.5'),
    ('timm-deep-stem', r'deep stem'),
    ('model-zoo-v1', r'MXNet Gluon model zoo resnet\*_v1/_v2'),
    ('resnext', r'ResNeXt-50 32x4d weights: the network is resnetv15_50: use --arch resnextv15 --num-layers 50 '
                r'--num-groups 32'),
    ('resnet-v1-target', r'ResNet v1.5 \(stride on the 3x3 convolution\), the network is ResNet v1'),
    ('xception-target', r'the network is xception, not a ResNet: use --arch resnetv15 --num-layers 50'),
    ('unknown', r'unrecognised parameter names \(e.g. classifier.bias, encoder.conv.weight\)'),
    ('stem-channels', r'stem with 3 input channels, the network 1'),
])
def test_mismatches_are_clear_errors(case, message, gluoncv):
    target = models.get_model(num_layers=50)
    if case == 'depth':
        arrays = formats.nvidia_arrays(shapes_only(models.get_model(num_layers=18)))
    elif case == 'gluoncv-deep-stem':
        arrays = infer_shapes(gluoncv.resnet50_v1c())
    elif case == 'timm-deep-stem':
        arrays = formats.to_torchvision(infer_shapes(gluoncv.resnet50_v1d()))
    elif case == 'model-zoo-v1':
        arrays = infer_shapes(mx.gluon.model_zoo.vision.resnet50_v1())
    elif case == 'resnext':
        arrays = formats.torch_style_arrays(shapes_only(models.get_model('resnextv15', 50)), torchvision=True)
    elif case == 'resnet-v1-target':
        arrays, target = formats.torch_style_arrays(shapes_only(target)), models.get_model('resnetv1', 50)
    elif case == 'xception-target':
        arrays, target = formats.nvidia_arrays(shapes_only(target)), models.get_model('xception')
    elif case == 'unknown':
        arrays = {'encoder.conv.weight': np.zeros((8, 3, 3, 3)), 'classifier.bias': np.zeros(10)}
    else:
        arrays, target = shapes_only(target), models.resnetv15(50, in_channels=1)   # no --image-shape allows 1
    with pytest.raises(RecipeError, match=message):
        weight_conversion.convert(arrays, target)


def test_own_checkpoints_of_other_architectures_convert_by_shape():
    """This recipe's names are the same for v1 and v1.5, ResNeXt and other layouts: shapes decide."""
    resnext = shapes_only(models.get_model('resnextv15', 50, num_groups=32, num_classes=10))
    assert weight_origins.recognise(resnext).arch == 'ResNeXt-50 32x4d'
    params, _ = weight_conversion.convert(resnext, models.get_model('resnextv1', 50, num_groups=32, num_classes=10))
    assert len(params) == len(resnext)
    with pytest.raises(RecipeError, match=r'unit1.body.conv1.weight has shape \(128, 64, 1, 1\), the network '
                                          r'expects \(32, 64, 1, 1\): check --arch, --num-layers, --num-groups'):
        weight_conversion.convert(resnext, models.get_model('resnextv15', 50, num_groups=8, num_classes=10))
    xception = shapes_only(models.get_model('xception', num_classes=10))
    assert weight_origins.recognise(xception).arch == 'Xception'


# --------------------------------------------------------------------------------------------------------
# Files


def test_unreadable_files_are_clear_errors(tmp_path):
    state = {'fc.weight': np.ones((10, 8), np.float32), 'fc.bias': np.zeros(10, np.float32)}
    from safetensors.numpy import save_file
    save_params(state, tmp_path / 'good.params')
    save_file(state, str(tmp_path / 'good.safetensors'))
    np.savez(tmp_path / 'good.npz', **state)
    for suffix in ('.params', '.safetensors', '.npz'):
        assert set(weight_loading.read_arrays(tmp_path / f'good{suffix}')) == set(state)
        content = (tmp_path / f'good{suffix}').read_bytes()
        (tmp_path / f'truncated{suffix}').write_bytes(content[:len(content) * 2 // 3])
        (tmp_path / f'text{suffix}').write_text('epoch 1: accuracy 0.5\n' * 20)
    cases = {
        'missing.params': 'weights file .*missing.params does not exist',
        'truncated.params': r'truncated.params is not a readable MXNet parameter file \(truncated or corrupt\?\): '
                            'Invalid NDArray file format$',
        'text.params': 'text.params is not a readable MXNet parameter file.*: Invalid NDArray file format$',
        'truncated.safetensors': r'truncated.safetensors is not a readable .safetensors file \(truncated or corrupt',
        'text.safetensors': 'text.safetensors is not a readable .safetensors file',
        'truncated.npz': r'truncated.npz is not a readable .npz archive',
        'text.npz': r'text.npz is not a readable .npz archive',
        'model.pth': r"unknown weights format '.pth'.*needs PyTorch: save it as .safetensors",
        'model_last.state': r'model_last.state is damaged \(truncated or corrupt: Invalid NDArray file format\)$',
        'model.ckpt': r"unknown weights format '.ckpt'; expected one of .params, .safetensors, .npz, .state",
    }
    header = json.dumps({'w': {'dtype': 'BF16', 'shape': [2], 'data_offsets': [0, 4]}}).encode()
    (tmp_path / 'bf16.safetensors').write_bytes(struct.pack('<Q', len(header)) + header + b'\x80\x3f\x00\x40')
    cases['bf16.safetensors'] = 'bf16.safetensors holds bfloat16 tensors, which NumPy .*cannot represent: save'
    (tmp_path / 'model.pth').write_bytes(b'PK')
    (tmp_path / 'model.ckpt').write_bytes(b'PK')
    (tmp_path / 'model_last.state').write_bytes(b'')
    for name, message in cases.items():
        with pytest.raises(RecipeError, match=message) as error:
            weight_loading.read_arrays(tmp_path / name)
        assert 'Traceback' not in str(error.value) and '\n' not in str(error.value), str(error.value)
    mx.nd.save(str(tmp_path / 'list.params'), [mx.nd.ones(3)])
    with pytest.raises(RecipeError, match='list of 1 arrays without names'):
        weight_loading.read_arrays(tmp_path / 'list.params')


def test_mxnet_message_keeps_the_meaningful_line():
    error = mx.base.MXNetError('Traceback (most recent call last):\n  File "../src/ndarray/ndarray.cc", line 1860\n'
                               'MXNetError: Check failed: fi->Read(data): Invalid NDArray file format')
    assert errors.mxnet_message(error) == 'Invalid NDArray file format'
    full_disk = mx.base.MXNetError('Traceback (most recent call last):\n  File "../3rdparty/dmlc-core/src/io/'
                                   'local_filesys.cc", line 38\nMXNetError: Check failed: std: :fwrite(ptr, 1, size, '
                                   'fp_) == size: FileStream.Write incomplete')
    assert errors.mxnet_message(full_disk) == 'FileStream.Write incomplete'


# --------------------------------------------------------------------------------------------------------
# Normalisation


@pytest.mark.parametrize('kind,mean,std', [
    ('nvidia', (123.68, 116.779, 103.939), (58.393, 57.12, 57.375)),
    ('recipe', (123.68, 116.779, 103.939), (58.393, 57.12, 57.375)),
    ('gluoncv', (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
    ('torchvision', (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
])
def test_normalisation_and_matching_flags(kind, mean, std):
    norm = weight_origins.normalisation(kind)
    assert norm['mean'] == mean and norm['std'] == std
    parser = argparse.ArgumentParser()
    data.add_data_args(parser)
    args = parser.parse_args(norm['flags'].split())
    assert args.rgb_mean == mean and args.rgb_std == std
    if kind == 'torchvision':
        assert args.data_val_resize == 232 and args.image_shape == (3, 224, 224)
        assert '288' in norm['evaluation']
    origin = weight_origins.recognise(shapes_only(models.get_model(num_layers=18)))
    assert weight_origins.normalisation(origin) == weight_origins.normalisation('recipe')
