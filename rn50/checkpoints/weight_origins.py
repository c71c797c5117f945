"""Which network a parameter dictionary holds, whatever its origin: `recognise` reads the names, shapes and dtypes
and returns an Origin (kind, architecture, depth, layout, stem width, dtype, class count, and each name's in this
recipe), or a RecipeError that says what was found; `normalisation` the input normalisation those weights expect.

    from rn50.checkpoints import weight_loading, weight_origins

    arrays = weight_loading.read_arrays('resnet50_v1b.params')       # .params, .safetensors or .npz
    origin = weight_origins.recognise(arrays)                        # GluonCV ResNet-50 (float32, OIHW, ...)
    norm = weight_origins.normalisation(origin)
    log.info('these weights expect %s', norm['flags'])                # --rgb-mean ... --rgb-std ...

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

Another architecture, a deep stem, an average-pool shortcut, a wide ResNet or MXNet's model zoo v1/v2 are
refused here, naming what they are. weight_conversion.py turns a recognised dictionary into a network's arrays.
"""
import collections
import dataclasses
import re

import numpy as np

from rn50.errors import RecipeError
from rn50.nets.catalogue import RESNET_DEPTHS, RESNEXT_WIDTH_PER_GROUP

BATCHNORM_STATS = ('gamma', 'beta', 'running_mean', 'running_var')
ORIGINS = {'recipe': "this recipe's", 'nvidia': "NVIDIA's original recipe", 'gluoncv': 'GluonCV',
           'torchvision': 'torchvision/timm'}
DEPTH_OF = {(kind, units): depth for depth, (kind, units) in RESNET_DEPTHS.items()}

# mean, std on 0-255 RGB
NVIDIA_NORMALISATION = ((123.68, 116.779, 103.939), (58.393, 57.12, 57.375))
IMAGENET_NORMALISATION = ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))   # (0.485, ...) x 255


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
    mapping = {'recipe': _recipe_names, 'nvidia': _nvidia_names, 'gluoncv': torch_style_names,
               'torchvision': torch_style_names}[kind](set(stripped), kind)
    names_map = {stripped[source]: target for source, target in mapping.items()}
    targets = [t for t in names_map.values() if t is not None]
    duplicates = [t for t, n in collections.Counter(targets).items() if n > 1]
    if duplicates:
        raise RecipeError(f'{ORIGINS[kind]} weights with two entries for {duplicates[0]} (mixed fused and '
                          'unfused names?)')
    canonical_shapes = {target: shapes[source] for source, target in names_map.items() if target is not None}
    layout = _layout({n: s for n, s in canonical_shapes.items() if len(s) == 4})
    oihw = {n: to_oihw_shape(s, layout) for n, s in canonical_shapes.items()}
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


def torch_style_names(names, kind):
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


def to_oihw_shape(shape, layout):
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
