"""Weights from anywhere: recognise a parameter dictionary of a supported origin and convert it to this
recipe's network.

One responsibility: names, shapes, layouts and dtypes of parameter dictionaries. Reading the files
(weight_files.read_arrays) and loading the result into the network (weight_files.load_weights) belong to
weight_files.py. Usage:

    import models
    from rn50.checkpoints import weight_files, weights

    net = models.get_model(num_layers=50, num_classes=10)             # any layout, dtype, stem width
    arrays = weight_files.read_arrays('resnet50_v1b.params')          # .params, .safetensors or .npz
    params, description = weights.convert(arrays, net, new_classifier=True, source='resnet50_v1b.params')
    log.info('%s', description)                                       # what was recognised and converted
    norm = weights.normalisation(weights.recognise(arrays))
    log.info('these weights expect %s', norm['flags'])                # --rgb-mean ... --rgb-std ...
    # then put `params` (name -> numpy array, exactly the network's shapes and dtypes) into the network,
    # and initialise the classifier if it was left out (`'output.weight' not in params`)

Origins recognised, as their own code names the parameters (NVIDIA's DeepLearningExamples MXNet/Classification/
RN50v1.5 resnet.py; GluonCV's model_zoo/resnetv1b.py; torchvision's models/resnet.py and timm's resnet.py):

* 'recipe': this recipe's own names (`features.stage2.unit1.body.conv2.weight`), any architecture of
  models.py, written under any layout (OIHW or OHWI convolution weights), precision or stem width.
* 'nvidia': the original NVIDIA recipe, ResNet-18/34/50/101/152: float32 NCHW `features.N...` names;
  float16 `_net.`-prefixed names with the stem in `features.0.1` and OHWI weights; a 4-channel stem; the
  fused-batchnorm names without the inner `.0` / `.bn` level.
* 'gluoncv': GluonCV `resnet{18,34,50,101,152}_v1b` (`conv1`, `bn1.gamma`, `layer1.0.conv1`, `fc`).
* 'torchvision': torchvision / timm ResNet and ResNeXt (Nx4d) state dicts (batchnorm `weight`/`bias`,
  `num_batches_tracked` ignored; a `module.` prefix from DataParallel is removed).

Whatever the origin, `convert` produces the target network's layout (OIHW <-> OHWI, decided by each
convolution's configured layout), stem width (a 4th input channel is dropped or zero-padded: the recipe
feeds that channel zeros) and dtypes (float16 <-> float32). Anything else (another architecture, a deep
stem, a depth or class-count mismatch) is a RecipeError that says what was found and what was expected.

The way out uses the same names: `to_torchvision(params)` gives the state dict torchvision's (and timm's) network
of the same shape loads with strict=True, from the portable network's parameters (export's).
"""
import collections
import dataclasses
import re

import numpy as np
from mxnet.gluon import nn

from rn50.errors import RecipeError
from rn50.nets.catalogue import RESNET_DEPTHS, RESNEXT_WIDTH_PER_GROUP

BATCHNORM_STATS = ('gamma', 'beta', 'running_mean', 'running_var')
CLASSIFIER = ('output.weight', 'output.bias')
ORIGINS = {'recipe': "this recipe's", 'nvidia': "NVIDIA's original recipe", 'gluoncv': 'GluonCV',
           'torchvision': 'torchvision/timm'}
DEPTH_OF = {(kind, units): depth for depth, (kind, units) in RESNET_DEPTHS.items()}

# mean, std on 0-255 RGB
NVIDIA_NORMALISATION = ((123.68, 116.779, 103.939), (58.393, 57.12, 57.375))
IMAGENET_NORMALISATION = ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))   # (0.485, ...) x 255


# ----------------------------------------------------------------------------------------------------------
# Recognising the origin


@dataclasses.dataclass(frozen=True)
class Origin:
    """What a parameter dictionary is. `kind`: 'recipe', 'nvidia', 'gluoncv' or 'torchvision'; `arch`: e.g.
    'ResNet-50', 'ResNeXt-50 32x4d', 'Xception'; `depth`: ResNet/ResNeXt depth or None; `layout`: 'OIHW' or
    'OHWI' (convolution weights); `stem_channels`: input channels of the first convolution; `dtype`: of the
    convolution and dense weights ('float32', 'float16' or e.g. 'float16+float32'); `fused`: NVIDIA's
    fused-batchnorm names; `num_classes`: classifier width; `names`: source name -> this recipe's name
    (None for entries that are not weights, such as num_batches_tracked)."""
    kind: str
    arch: str
    depth: object
    layout: str
    stem_channels: int
    dtype: str
    num_classes: int
    fused: bool = False
    names: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def describe(self):
        details = [self.dtype, self.layout, f'{self.stem_channels}-channel stem']
        if self.kind == 'nvidia':
            details.append('fused batchnorm names' if self.fused else 'unfused batchnorm names')
        details.append(f'{self.num_classes} classes')
        return f'{ORIGINS[self.kind]} {self.arch} ({", ".join(details)})'


def recognise(arrays):
    """The Origin of a parameter dictionary (name -> numpy array or NDArray): its kind, depth (from the
    names), layout, stem width, dtype and class count. RecipeError for anything that is not a supported
    origin, naming what was found: another architecture, a deep stem (GluonCV v1c/v1d/v1e/v1s, timm
    resnet*d), MXNet model zoo resnet*_v1/v2, a wide ResNet or a ResNeXt from another source."""
    if not isinstance(arrays, dict) or not arrays:
        raise RecipeError('no parameters to recognise (an empty or unnamed dictionary)')
    shapes = {name: tuple(np.shape(value)) for name, value in arrays.items()}
    names = set(shapes)
    kind, strip = _kind(names)
    stripped = {name[len(strip):]: name for name in names}
    mapping = {'recipe': _recipe_names, 'nvidia': _nvidia_names, 'gluoncv': _torch_style_names,
               'torchvision': _torch_style_names}[kind](set(stripped), kind)
    names_map = {stripped[source]: target for source, target in mapping.items()}
    targets = [t for t in names_map.values() if t is not None]
    duplicates = [t for t, n in collections.Counter(targets).items() if n > 1]
    if duplicates:
        raise RecipeError(f'{ORIGINS[kind]} weights with two entries for {duplicates[0]} (mixed fused and '
                          'unfused names?)')
    canonical_shapes = {target: shapes[source] for source, target in names_map.items() if target is not None}
    layout = _layout({n: s for n, s in canonical_shapes.items() if len(s) == 4})
    oihw = {n: _to_oihw_shape(s, layout) for n, s in canonical_shapes.items()}
    arch, depth = _architecture(oihw, kind)
    stem = oihw.get('features.conv0.weight') or oihw.get('features.conv1.weight')
    if 'output.weight' not in oihw:
        raise RecipeError(f'{ORIGINS[kind]} {arch} weights without a classifier (output.weight / fc.weight)')
    weight_dtypes = sorted({np.dtype(arrays[s].dtype).name for s, t in names_map.items()
                            if t is not None and t.endswith('weight') and len(shapes[s]) in (2, 4)})
    return Origin(kind=kind, arch=arch, depth=depth, layout=layout, stem_channels=stem[1] if stem else 0,
                  dtype='+'.join(weight_dtypes), num_classes=oihw['output.weight'][0],
                  fused=kind == 'nvidia' and _nvidia_fused(set(stripped)), names=names_map)


def _kind(names):
    """(kind, prefix to strip) from the names alone, or a RecipeError naming what it looks like."""
    if all(n.startswith('_net.') for n in names):
        return 'nvidia', '_net.'
    strip = 'module.' if all(n.startswith('module.') for n in names) else ''
    plain = {n[len(strip):] for n in names}
    if any(n.startswith(('features.conv0.', 'features.stage', 'features.block', 'features.conv1.'))
           for n in plain) and not strip:
        return 'recipe', ''
    if any(re.match(r'features\.[0-9]+\.', n) for n in plain) and not strip:
        if any(re.match(r'features\.(7|4\.\d+\.body\.[5-7])\.', n) for n in plain):
            raise RecipeError('these look like MXNet Gluon model zoo resnet*_v1/_v2 weights (stages at '
                              'features.4-7): a different network (v1 has the stride on the first 1x1 '
                              'convolution); expected ResNet v1.5 weights: this recipe\'s, NVIDIA\'s original '
                              'recipe, GluonCV resnet*_v1b or torchvision/timm resnet*')
        return 'nvidia', ''
    if any(re.match(r'conv1\.\d+\.weight$', n) for n in plain):
        raise RecipeError('these weights have a deep stem (conv1.0/conv1.3/conv1.6: three 3x3 convolutions, as '
                          'GluonCV resnet*_v1c/v1d/v1e/v1s or timm resnet*d): a different network from ResNet '
                          'v1.5, whose stem is one 7x7 convolution (conv1.weight); use the _v1b / plain '
                          'resnet* weights')
    if 'conv1.weight' in plain and any(n.startswith('layer1.') for n in plain):
        if 'bn1.gamma' in plain:
            return 'gluoncv', strip
        return 'torchvision', strip
    examples = ', '.join(sorted(names)[:4])
    raise RecipeError(f'unrecognised parameter names (e.g. {examples}): expected a ResNet v1.5 from this recipe '
                      "(features.stage1...), NVIDIA's original recipe (features.3.0.body...), GluonCV "
                      'resnet*_v1b or torchvision/timm resnet* (conv1, layer1..layer4, fc)')


def _recipe_names(names, kind):
    return {n: n for n in names}


def _nvidia_fused(names):
    return any(re.search(r'(bn_add_relu|body\.[13]|^features\.1)\.gamma$', n) for n in names)


def _nvidia_names(names, kind):
    """NVIDIA's original recipe -> this recipe's names (documented in foreign-weights.md, section 1)."""
    bottleneck = any(re.match(r'features\.[3-6]\.\d+\.body\.4\.weight$', n) for n in names)
    convs = {'0': 'conv1', '2': 'conv2', '4': 'conv3'}
    bns = {'1': 'bn1', '3': 'bn2'}
    stat = '(' + '|'.join(BATCHNORM_STATS) + ')'
    mapping, unknown = {}, []
    for name in names:
        if re.fullmatch(r'features\.0(?:\.1)?\.weight', name):
            mapping[name] = 'features.conv0.weight'
            continue
        m = re.fullmatch(rf'features\.1(?:\.0)?\.{stat}', name)
        if m:
            mapping[name] = f'features.bn0.{m.group(1)}'
            continue
        if re.fullmatch(r'output\.(weight|bias)', name):
            mapping[name] = name
            continue
        m = re.fullmatch(rf'features\.([3-6])\.(\d+)\.(body\.[0-4](?:\.0)?|bn_add_relu(?:\.bn)?|downsample\.[01])'
                         rf'\.(weight|{stat[1:-1]})', name)
        if m is None:
            unknown.append(name)
        else:
            stage, block, layer, leaf = int(m.group(1)) - 2, int(m.group(2)) + 1, m.group(3), m.group(4)
            unit = f'features.stage{stage}.unit{block}.'
            index = layer.split('.')[1] if layer.startswith(('body', 'downsample')) else None
            is_weight = leaf == 'weight'
            if layer.startswith('body') and is_weight and index in convs and layer == f'body.{index}':
                if index == '4' and not bottleneck:
                    unknown.append(name)
                    continue
                mapping[name] = f'{unit}body.{convs[index]}.weight'
            elif layer.startswith('body') and not is_weight and index in bns:
                if index == '3' and not bottleneck:
                    unknown.append(name)
                    continue
                mapping[name] = f'{unit}body.{bns[index]}.{leaf}'
            elif layer.startswith('bn_add_relu') and not is_weight:
                mapping[name] = f'{unit}final_bn.{leaf}'
            elif layer == 'downsample.0' and is_weight:
                mapping[name] = f'{unit}shortcut.conv.weight'
            elif layer == 'downsample.1' and not is_weight:
                mapping[name] = f'{unit}shortcut.bn.{leaf}'
            else:
                unknown.append(name)
    _refuse_unknown(unknown, "NVIDIA's original recipe (ResNet v1.5)")
    return mapping


def _torch_style_names(names, kind):
    """GluonCV resnet*_v1b / torchvision / timm -> this recipe's names (foreign-weights.md, sections 2, 3)."""
    bottleneck = any(re.match(r'layer[1-4]\.\d+\.conv3\.weight$', n) for n in names)
    last_bn = 'bn3' if bottleneck else 'bn2'
    torch_stats = {'weight': 'gamma', 'bias': 'beta', 'running_mean': 'running_mean',
                   'running_var': 'running_var', 'num_batches_tracked': None}
    stats = dict(torch_stats) if kind == 'torchvision' else {s: s for s in BATCHNORM_STATS}
    mapping, unknown = {}, []
    for name in names:
        m = re.fullmatch(r'(?:layer([1-4])\.(\d+)\.)?(conv[1-3]|bn[1-3]|downsample\.[01]|fc)\.(\w+)', name)
        top_level = m is not None and m.group(1) is None
        if m is None or (top_level and m.group(3) not in ('conv1', 'bn1', 'fc')) or (
                not top_level and m.group(3) == 'fc'):
            unknown.append(name)
            continue
        layer, leaf = m.group(3), m.group(4)
        if m.group(1) is None:
            prefix = 'features.'
        else:
            prefix = f'features.stage{m.group(1)}.unit{int(m.group(2)) + 1}.'
        is_bn = layer.startswith('bn') or layer == 'downsample.1'
        if layer == 'fc' and leaf in ('weight', 'bias'):
            mapping[name] = f'output.{leaf}'
        elif is_bn and leaf in stats:
            leaf = stats[leaf]
            if leaf is None:
                mapping[name] = None
            elif m.group(1) is None:
                mapping[name] = f'features.bn0.{leaf}'
            elif layer == 'downsample.1':
                mapping[name] = f'{prefix}shortcut.bn.{leaf}'
            elif layer == last_bn:
                mapping[name] = f'{prefix}final_bn.{leaf}'
            elif layer == 'bn3':
                unknown.append(name)
            else:
                mapping[name] = f'{prefix}body.{layer}.{leaf}'
        elif not is_bn and leaf == 'weight' and layer != 'fc':
            if m.group(1) is None:
                mapping[name] = 'features.conv0.weight'
            elif layer == 'downsample.0':
                mapping[name] = f'{prefix}shortcut.conv.weight'
            elif layer == 'conv3' and not bottleneck:
                unknown.append(name)
            else:
                mapping[name] = f'{prefix}body.{layer}.weight'
        else:
            unknown.append(name)
    if kind == 'gluoncv' and any(re.fullmatch(r'layer[1-4]\.0\.downsample\.2\.\w+', n) for n in unknown):
        raise RecipeError('these GluonCV weights have an average-pool shortcut (downsample.0 pool, .1 conv, .2 '
                          'batchnorm: resnet*_v1d/v1e/v1s): a different network from ResNet v1.5; use resnet*_v1b')
    _refuse_unknown(unknown, f'{ORIGINS[kind]} ResNet v1.5')
    return mapping


def _refuse_unknown(unknown, what):
    if unknown:
        raise RecipeError(f'{len(unknown)} parameter names are not part of {what}, e.g. '
                          f'{", ".join(sorted(unknown)[:3])}: another architecture?')


def _layout(conv_shapes):
    """'OIHW' or 'OHWI' from the 4-d weights whose shape tells (square kernels: OIHW has H == W in dims 2, 3,
    OHWI in dims 1, 2); OIHW when none tells."""
    votes = collections.Counter()
    for shape in conv_shapes.values():
        oihw, ohwi = shape[2] == shape[3] and shape[1] != shape[2], shape[1] == shape[2] and shape[3] != shape[2]
        if oihw != ohwi:
            votes['OIHW' if oihw else 'OHWI'] += 1
    if len(votes) > 1:
        raise RecipeError(f'convolution weights in two layouts ({votes["OIHW"]} OIHW, {votes["OHWI"]} OHWI): not '
                          'one network\'s checkpoint')
    return next(iter(votes), 'OIHW')


def _to_oihw_shape(shape, layout):
    return (shape[0], shape[3], shape[1], shape[2]) if len(shape) == 4 and layout == 'OHWI' else shape


def resnet_structure(names):
    """(unit kind, units per stage) of this recipe's ResNet/ResNeXt names, or None if they are not one."""
    units = collections.defaultdict(set)
    for name in names:
        m = re.match(r'features\.stage([1-4])\.unit(\d+)\.', name)
        if m:
            units[int(m.group(1))].add(int(m.group(2)))
    if sorted(units) != [1, 2, 3, 4]:
        return None
    kind = 'bottleneck' if any(n.endswith('body.conv3.weight') for n in names) else 'basic'
    return kind, tuple(len(units[s]) for s in (1, 2, 3, 4))


def _architecture(oihw, kind):
    """(arch label, depth) from this recipe's names and OIHW shapes; RecipeError for a foreign network that
    is not a ResNet v1.5 of a standard depth."""
    if kind == 'recipe' and any(n.startswith('features.block') for n in oihw):
        return 'Xception', None
    structure = resnet_structure(oihw)
    origin = ORIGINS[kind]
    if structure is None:
        raise RecipeError(f'{origin} weights without the four ResNet stages: another architecture?')
    depth = DEPTH_OF.get(structure)
    if depth is None:
        raise RecipeError(f'{origin} weights of a ResNet with {structure[0]} units {structure[1]} per stage, '
                          f'which is no standard depth ({", ".join(map(str, RESNET_DEPTHS))})')
    conv1, conv2 = oihw.get('features.stage1.unit1.body.conv1.weight'), oihw.get(
        'features.stage1.unit1.body.conv2.weight')
    stem = oihw.get('features.conv0.weight')
    if stem is None or len(stem) != 4 or stem[2:] != (7, 7) or stem[0] != 64:
        raise RecipeError(f'{origin} weights whose stem is {stem} (ResNet v1.5: one 7x7 convolution with 64 '
                          'outputs): another architecture?')
    if structure[0] == 'bottleneck' and conv1 and conv2:
        width, per_group = conv1[0], conv2[1]
        if per_group != width:
            groups = width // per_group
            if kind == 'recipe' or per_group == RESNEXT_WIDTH_PER_GROUP:
                return f'ResNeXt-{depth} {groups}x{per_group}d', depth
            raise RecipeError(f'{origin} weights of a ResNeXt-{depth} {groups}x{per_group}d (grouped 3x3 '
                              f'convolutions, {per_group} channels per group): this recipe builds ResNeXt with '
                              f'{RESNEXT_WIDTH_PER_GROUP} channels per group in the first stage (Nx4d)')
        if width != 64:
            raise RecipeError(f'{origin} weights of a wide ResNet-{depth} (bottleneck width {width} in the first '
                              'stage, ResNet v1.5 has 64): another architecture')
    return f'ResNet-{depth}', depth


# ----------------------------------------------------------------------------------------------------------
# Converting


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
    """(params, description): the dictionary `arrays` (of any origin `recognise` knows) converted to the
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
    origin = recognise(arrays)
    own = net._collect_params_with_prefix()
    unknown = [name for name, param in own.items() if param.shape is None or not all(param.shape)]
    if unknown:
        raise RecipeError(f'the network has parameters of unknown shape ({unknown[0]}, ...): build it with '
                          'declared input channels (models.get_model does)')
    target_structure = resnet_structure(own)
    target_depth = DEPTH_OF.get(target_structure) if target_structure else None
    target_arch = re.search(r'(resnetv15?|resnextv15?)_\d+(?:_\d+x\d+d)?_$', getattr(net, 'prefix', ''))
    target_arch = target_arch.group(1) if target_arch else None
    what = f'{source}: {ORIGINS[origin.kind]} {origin.arch} weights'
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
            target_oihw = _to_oihw_shape(target_shape, target_layout)
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
    stem_channels = _to_oihw_shape(tuple(stem), _weight_layout(layouts[stem_name]))[1] if stem else '?'
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
    kind, units = resnet_structure(names)
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
    names = _torch_style_names(set(keys), 'torchvision')
    left = sorted(set(params) - set(names.values()))
    if left:
        raise ValueError(f'{len(left)} parameters have no torchvision name, e.g. {left[:3]}')
    return {key: np.zeros((), np.int64) if names[key] is None else params[names[key]] for key in keys}


# ----------------------------------------------------------------------------------------------------------
# Normalisation


def normalisation(origin):
    """The input normalisation the weights of `origin` (an Origin or its kind) expect, for the log:
    {'mean': (r, g, b), 'std': (r, g, b)} on 0-255 RGB, 'flags': the matching train.py flags, and
    'evaluation': how the published weights were evaluated (torchvision/timm), or ''."""
    kind = origin.kind if isinstance(origin, Origin) else origin
    if kind not in ORIGINS:
        raise ValueError(f'unknown origin {kind!r}: one of {", ".join(ORIGINS)}')
    mean, std = NVIDIA_NORMALISATION if kind in ('recipe', 'nvidia') else IMAGENET_NORMALISATION
    flags = f'--rgb-mean {",".join(map(str, mean))} --rgb-std {",".join(map(str, std))}'
    evaluation = ''
    if kind == 'torchvision':
        evaluation = ('torchvision IMAGENET1K_V2: resize 232, crop 224 (--data-val-resize 232 --image-shape '
                      '3,224,224); timm resnet50.a1_in1k: 288 / 224 crop (--data-val-resize 288 --image-shape '
                      '3,224,224)')
        flags += ' --data-val-resize 232 --image-shape 3,224,224'
    return {'mean': mean, 'std': std, 'flags': flags, 'evaluation': evaluation}
