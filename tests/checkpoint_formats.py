"""Parameter dictionaries in other origins' layouts (as NVIDIA's DeepLearningExamples MXNet resnet.py, GluonCV's
model_zoo/resnetv1b.py and torchvision's models/resnet.py name and shape them), written from a float32 NCHW
network of this recipe, independently of weight_origins.py's mapping: the renaming tables here are written from those
sources' naming, not from weight_origins.py. Used by tests/test_weights.py and scripts/benchmark_convert.py."""
import importlib.util
import os
import re

import numpy as np

# this recipe's layer within a residual unit -> the original NVIDIA recipe's (unfused, fused)
NVIDIA_UNIT = {'body.conv1': ('body.0', 'body.0'), 'body.bn1': ('body.1.0', 'body.1'),
               'body.conv2': ('body.2', 'body.2'), 'body.bn2': ('body.3.0', 'body.3'),
               'body.conv3': ('body.4', 'body.4'), 'final_bn': ('bn_add_relu.bn', 'bn_add_relu'),
               'shortcut.conv': ('downsample.0', 'downsample.0'), 'shortcut.bn': ('downsample.1', 'downsample.1')}
BATCHNORM = ('gamma', 'beta', 'running_mean', 'running_var')


def recipe_arrays(net):
    """name -> numpy array of an initialised network (the names save_parameters writes)."""
    return {name: param.data().asnumpy() for name, param in net._collect_params_with_prefix().items()}


def nvidia_arrays(arrays, float16=False, fused=False, seed=0):
    """The original recipe's checkpoint of the same weights. float32: NCHW, `features.N` names. float16: the
    `_net.` prefix, the stem in `features.0.1` with 4 input channels (the 4th random: the data never use it),
    OHWI convolution weights, float16 convolution/dense weights, float32 batchnorm. `fused`: batchnorm names
    without the inner `.0` / `.bn` level."""
    rng = np.random.RandomState(seed)
    out = {}
    for name, value in arrays.items():
        m = re.fullmatch(r'features\.stage(\d)\.unit(\d+)\.(.+)\.(\w+)', name)
        if name == 'features.conv0.weight':
            new = 'features.0.1.weight' if float16 else 'features.0.weight'
            if float16:
                value = np.concatenate([value, rng.normal(size=value[:, :1].shape).astype(value.dtype)], axis=1)
        elif name.startswith('features.bn0.'):
            new = ('features.1.' if fused else 'features.1.0.') + name.rsplit('.', 1)[1]
        elif name.startswith('output.'):
            new = name
        elif m:
            layer = NVIDIA_UNIT[m.group(3)][fused]
            new = f'features.{int(m.group(1)) + 2}.{int(m.group(2)) - 1}.{layer}.{m.group(4)}'
        else:
            raise ValueError(name)
        if float16:
            if value.ndim == 4:
                value = value.transpose(0, 2, 3, 1)          # OIHW -> OHWI
            if not new.endswith(BATCHNORM):
                value = value.astype(np.float16)
            new = '_net.' + new
        out[new] = np.ascontiguousarray(value)
    return out


def torch_style_arrays(arrays, torchvision=False):
    """GluonCV resnet*_v1b names (or torchvision/timm state-dict names, with `num_batches_tracked`)."""
    bottleneck = any(n.endswith('conv3.weight') for n in arrays)
    out = {}
    for name, value in arrays.items():
        m = re.fullmatch(r'features\.stage(\d)\.unit(\d+)\.(.+)\.(\w+)', name)
        if name.startswith('features.conv0.'):
            layer, leaf = 'conv1', 'weight'
        elif name.startswith('features.bn0.'):
            layer, leaf = 'bn1', name.rsplit('.', 1)[1]
        elif name.startswith('output.'):
            layer, leaf = 'fc', name.rsplit('.', 1)[1]
        else:
            inner = {'final_bn': 'bn3' if bottleneck else 'bn2', 'shortcut.conv': 'downsample.0',
                     'shortcut.bn': 'downsample.1'}.get(m.group(3), m.group(3).replace('body.', ''))
            layer, leaf = f'layer{m.group(1)}.{int(m.group(2)) - 1}.{inner}', m.group(4)
        out[f'{layer}.{leaf}'] = value
    return to_torchvision(out) if torchvision else out


def to_torchvision(gluoncv):
    """GluonCV names -> torchvision: batchnorm gamma/beta are weight/bias, plus an int64 num_batches_tracked."""
    out = {}
    for name, value in gluoncv.items():
        layer, leaf = name.rsplit('.', 1)
        leaf = {'gamma': 'weight', 'beta': 'bias'}.get(leaf, leaf)
        out[f'{layer}.{leaf}'] = value
        if leaf == 'running_var':
            out[f'{layer}.num_batches_tracked'] = np.array(1234, dtype=np.int64)
    return out


def gluoncv_resnetv1b():
    """GluonCV 0.10.5's model_zoo/resnetv1b.py, loaded by file path: the package root imports modules whose
    dependencies are not installed (it is installed --no-deps), this file needs only MXNet."""
    spec = importlib.util.find_spec('gluoncv')
    if spec is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), 'model_zoo', 'resnetv1b.py')
    module_spec = importlib.util.spec_from_file_location('gluoncv_resnetv1b', path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module
