"""Weights of any origin weight_origins.py recognises, converted to this recipe's network, and the way back out:
`convert` gives each of the network's parameters its array in exactly its shape and dtype, `to_torchvision` the
state dict torchvision's (and timm's) network of the same shape loads. Usage:

    import models
    from rn50.checkpoints import weight_conversion, weight_loading

    net = models.get_model(num_layers=50, num_classes=10)             # any layout, dtype, stem width
    arrays = weight_loading.read_arrays('resnet50_v1b.params')        # .params, .safetensors or .npz
    params, description = weight_conversion.convert(arrays, net, new_classifier=True, source='resnet50_v1b.params')
    log.info('%s', description)                                       # what was recognised and converted
    # then put `params` (name -> numpy array, exactly the network's shapes and dtypes) into the network,
    # and initialise the classifier if it was left out (`'output.weight' not in params`)

Whatever the origin, `convert` produces the target network's layout (OIHW <-> OHWI, decided by each
convolution's configured layout), stem width (a 4th input channel is dropped or zero-padded: the recipe
feeds that channel zeros) and dtypes (float16 <-> float32). Anything else (another architecture, a deep
stem, a depth or class-count mismatch) is a RecipeError that says what was found and what was expected.
Reading the files and loading the result into the network are weight_loading.py's.

The way out uses the same names: `to_torchvision(params)` gives the state dict torchvision's (and timm's) network
of the same shape loads with strict=True, from the portable network's parameters (export's).
"""
import collections
import re

import numpy as np
from mxnet.gluon import nn

from rn50.checkpoints import weight_origins
from rn50.errors import RecipeError

CLASSIFIER = ('output.weight', 'output.bias')


def conv_layouts(block, prefix=''):
    """Structural parameter name -> 'NCHW' / 'NHWC' of every convolution weight under `block` (NHWC weights
    are OHWI)."""
    layouts = {}
    if isinstance(block, nn.Conv2D):
        layouts[prefix + 'weight'] = block._kwargs['layout']
    for name, child in block._children.items():
        layouts.update(conv_layouts(child, f'{prefix}{name}.'))
    return layouts


def convert(arrays, net, new_classifier=False, source='weights'):
    """(params, description): the dictionary `arrays` (of any origin `weight_origins.recognise` knows) converted to the
    network `net` (a models.get_model network; it need not be initialised).

    `params` maps each of the network's structural parameter names (as `save_parameters` writes them) to a
    numpy array with exactly that parameter's shape and dtype: convolution weights transposed OIHW <-> OHWI
    as each convolution's layout requires, the stem's 4th input channel dropped or zero-padded (the data
    feed that channel zeros), float16 <-> float32, NVIDIA's fused/unfused and foreign names renamed.
    `description` is one line for the log: what was recognised and what was converted.

    A classifier of another width is a RecipeError unless `new_classifier` is true; with `new_classifier`
    the classifier (`output.weight`, `output.bias`) is always left out of `params` (the caller initialises
    it) and every other layer is converted. `source` names the weights in messages (e.g. the file path).
    RecipeError when the weights are another architecture or depth than the network."""
    arrays = {name: value.asnumpy() if hasattr(value, 'asnumpy') else np.asarray(value)
              for name, value in arrays.items()}
    origin = weight_origins.recognise(arrays)
    own = net._collect_params_with_prefix()
    unknown = [name for name, param in own.items() if param.shape is None or not all(param.shape)]
    if unknown:
        raise RecipeError(f'the network has parameters of unknown shape ({unknown[0]}, ...): build it with '
                          'declared input channels (models.get_model does)')
    target_structure = weight_origins.resnet_structure(own)
    target_depth = weight_origins.DEPTH_OF.get(target_structure) if target_structure else None
    target_arch = re.search(r'(resnetv15?|resnextv15?)_\d+(?:_\d+x\d+d)?_$', getattr(net, 'prefix', ''))
    target_arch = target_arch.group(1) if target_arch else None
    what = f'{source}: {weight_origins.ORIGINS[origin.kind]} {origin.arch} weights'
    if origin.kind != 'recipe':
        _check_foreign_target(what, origin, net, target_arch, target_structure)
    if target_depth is not None and origin.depth is not None and origin.depth != target_depth:
        raise RecipeError(f'{what}: the network is a ResNet-{target_depth}: pass '
                          f'--num-layers {origin.depth} (or use weights of depth {target_depth})')
    canonical = {target: arrays[name] for name, target in origin.names.items() if target is not None}
    target_classes = own['output.weight'].shape[0] if 'output.weight' in own else None
    skip = set()
    if new_classifier:
        skip = set(CLASSIFIER)
    elif target_classes is not None and target_classes != origin.num_classes:
        raise RecipeError(f'{what} have a {origin.num_classes}-class classifier, the network {target_classes} '
                          f'classes: pass --num-classes {origin.num_classes}, or start a new classifier '
                          '(new_classifier) to fine-tune on the other classes')
    missing = sorted(set(own) - set(canonical) - skip)
    unexpected = sorted(set(canonical) - set(own) - skip)
    if missing or unexpected:
        raise RecipeError(f'{what} do not match the network {_describe_target(net)} ({len(missing)} parameters '
                          f'missing, e.g. {missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]}): '
                          'check --arch, --num-layers and --num-groups')
    layouts = conv_layouts(net)
    stem_name = next((n for n in own if n in layouts), None)
    counts = collections.Counter()
    params = {}
    for name, param in own.items():
        if name in skip:
            continue
        value, target_shape, target_dtype = canonical[name], tuple(param.shape), np.dtype(param.dtype)
        if value.ndim == 4 and name in layouts:
            target_layout = _weight_layout(layouts[name])
            if origin.layout == 'OHWI':
                value = value.transpose(0, 3, 1, 2)
            target_oihw = weight_origins.to_oihw_shape(target_shape, target_layout)
            if name == stem_name and value.shape[1] != target_oihw[1]:
                value, change = _stem_channels(value, target_oihw, what)
                counts[change] += 1
            if target_layout == 'OHWI':
                value = value.transpose(0, 2, 3, 1)
            if target_layout != origin.layout:
                counts['transposed'] += 1
        if value.shape != target_shape:
            raise RecipeError(f'{what}: parameter {name} has shape {canonical[name].shape}, the network expects '
                              f'{target_shape}: check --arch, --num-layers, --num-groups and --image-shape')
        if value.dtype != target_dtype:
            counts[f'{value.dtype.name}->{target_dtype.name}'] += 1
        params[name] = np.ascontiguousarray(value, dtype=target_dtype)
    return params, _description(origin, net, source, counts, new_classifier, len(params), layouts, stem_name)


def _check_foreign_target(what, origin, net, target_arch, target_structure):
    """RecipeError when foreign weights (ResNet or ResNeXt v1.5) cannot go into the network at all."""
    grouped = origin.arch.startswith('ResNeXt')
    suggestion = f'--arch {"resnextv15" if grouped else "resnetv15"} --num-layers {origin.depth}'
    if grouped:
        suggestion += f' --num-groups {origin.arch.split()[-1].split("x")[0]}'
    if target_structure is None or target_arch is None:
        raise RecipeError(f'{what}: the network is {_describe_target(net)}, not a ResNet: use {suggestion}')
    if target_arch.endswith('v1') and target_structure[0] == 'bottleneck':
        family = 'ResNeXt' if grouped else 'ResNet'
        raise RecipeError(f'{what} are {family} v1.5 (stride on the 3x3 convolution), the network is {family} v1 '
                          f'(stride on the first 1x1): use {suggestion}')
    if grouped != target_arch.startswith('resnext'):
        raise RecipeError(f'{what}: the network is {_describe_target(net)}: use {suggestion}')


def _weight_layout(layout):
    return 'OHWI' if layout == 'NHWC' else 'OIHW'


def _stem_channels(value, target_oihw, what):
    have, want = value.shape[1], target_oihw[1]
    if (have, want) == (4, 3):
        return value[:, :3], "dropped the stem's 4th input channel"
    if (have, want) == (3, 4):
        pad = np.zeros(value.shape[:1] + (1,) + value.shape[2:], value.dtype)
        return np.concatenate([value, pad], axis=1), "zero-padded the stem to 4 input channels"
    raise RecipeError(f'{what} have a stem with {have} input channels, the network {want}: --image-shape needs '
                      f'{have} channels (3, or 4 with a zero 4th channel)')


def _describe_target(net):
    prefix = getattr(net, 'prefix', '').rstrip('_')
    return prefix or type(net).__name__


def _description(origin, net, source, counts, new_classifier, converted, layouts, stem_name):
    own = net._collect_params_with_prefix()
    weight_dtypes = sorted({np.dtype(p.dtype).name for n, p in own.items() if n.endswith('weight')})
    target_layouts = sorted({_weight_layout(layout) for layout in layouts.values()})
    stem = own[stem_name].shape if stem_name else None
    stem_channels = weight_origins.to_oihw_shape(tuple(stem), _weight_layout(layouts[stem_name]))[1] if stem else '?'
    changes = [f'transposed {counts["transposed"]} convolution weights {origin.layout}->{"/".join(target_layouts)}']\
        if counts['transposed'] else []
    changes += [change for change in counts if change.startswith(('dropped', 'zero-padded'))]
    changes += [f'cast {n} arrays {change}' for change, n in sorted(counts.items()) if '->' in change]
    if origin.kind == 'nvidia' or origin.kind in ('gluoncv', 'torchvision'):
        changes.insert(0, 'renamed')
    if new_classifier:
        changes.append(f'classifier left out for a new one ({origin.num_classes} -> '
                       f'{own["output.weight"].shape[0]} classes)')
    return (f'{source}: {origin.describe()} -> {_describe_target(net)} ({"+".join(weight_dtypes)}, '
            f'{"/".join(target_layouts)}, {stem_channels}-channel stem): {converted} arrays, '
            f'{", ".join(changes) or "unchanged"}')


# ----------------------------------------------------------------------------------------------------------
# The way out: torchvision's names

TORCH_BATCHNORM = ('weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked')


def torchvision_keys(names):
    """torchvision's state-dict keys, in its order, of the ResNet or ResNeXt whose parameters (this recipe's
    structural names) are `names`: conv1, bn1, layerS.B.convK / bnK, layerS.B.downsample.0 / .1 where the unit
    has a projection shortcut, fc."""
    kind, units = weight_origins.resnet_structure(names)
    layers = range(1, 4 if kind == 'bottleneck' else 3)
    keys = ['conv1.weight'] + [f'bn1.{leaf}' for leaf in TORCH_BATCHNORM]
    for stage, count in enumerate(units, start=1):
        for block in range(count):
            prefix = f'layer{stage}.{block}.'
            for i in layers:
                keys += [f'{prefix}conv{i}.weight'] + [f'{prefix}bn{i}.{leaf}' for leaf in TORCH_BATCHNORM]
            if f'features.stage{stage}.unit{block + 1}.shortcut.conv.weight' in names:
                keys += [f'{prefix}downsample.0.weight'] + [f'{prefix}downsample.1.{leaf}' for leaf in TORCH_BATCHNORM]
    return keys + ['fc.weight', 'fc.bias']


def to_torchvision(params):
    """torchvision's state dict ({key: numpy array}, in torchvision's order) of a ResNet or ResNeXt whose
    parameters `params` ({this recipe's name: array}) are float32, OIHW, with a 3-channel stem (export's portable
    network): the reading's own name mapping turned around, every array as it is (bit for bit), and each
    batchnorm's num_batches_tracked, a counter that torchvision's default momentum never reads, at 0."""
    keys = torchvision_keys(params)
    names = weight_origins.torch_style_names(set(keys), 'torchvision')
    left = sorted(set(params) - set(names.values()))
    if left:
        raise ValueError(f'{len(left)} parameters have no torchvision name, e.g. {left[:3]}')
    return {key: np.zeros((), np.int64) if names[key] is None else params[names[key]] for key in keys}
