"""The networks: ResNet v1 / v1.5, ResNeXt and Xception, in any layout, with fused batchnorm kernels and float16.

Used by train.py through the Model flags (and by benchmark.py through train.py):

    python train.py --arch resnetv15 --num-layers 50 ...            # the default network
    python train.py --arch resnextv15 --num-layers 101 --num-groups 32 ...
    ./runner -n 8 -b 192        # float16 on GPUs: 4-channel input, NHWC layers, fused batchnorm kernels

and from Python:

    import models
    from rn50.nets.network import Network
    net = models.build(Network.of(args), 'gpu')     # the resolved flags' network (train.py), on GPUs
    net = models.get_model('resnetv1', num_layers=101, num_classes=10)   # by hand: build(Network(...), 'cpu')
    net.initialize()            # every parameter carries its own initializer (no argument needed)
    net.hybridize(static_alloc=True, static_shape=True)

What every network shares:

* Initialisation as the original recipe: He-normal (fan-in) convolution and dense weights, zero dense bias,
  batchnorm gamma 1, beta 0, running mean 0, running variance 1, except the last batchnorm of every residual
  body, whose gamma starts at 0 so that each block starts as the identity. `--zero-gamma 0` starts that one at
  1 too (torchvision's and MLPerf's); `--init mlperf` draws the classifier from N(0, 0.01) (MLPerf's).
* No weight decay on batchnorm gamma/beta and on biases: `wd_mult = 0` on those parameters, so any Trainer
  honours it (the original recipe's README promised this, its code did not do it).
* Layouts: a `Builder` tracks the layout of the activations and inserts a transpose only where the next
  layer's configured layout differs, so NCHW and NHWC networks come from the same code.
* Fused batchnorm kernels: `fused_ops_available()` says what the installed MXNet has; an explicit request it
  cannot honour on the device is a RecipeError. Fused and unfused networks compute the same function.
* Parameter names (both Gluon's `param.name` and the structural names `save_parameters` writes, such as
  `features.stage2.unit1.body.conv2.weight`) do not depend on the fusion flags, the dtype or the layouts, so
  a checkpoint loads into any of those variants (NHWC convolution weights are stored OHWI, though).
"""
import logging

import numpy as np
from mxnet.gluon import HybridBlock, nn

from rn50 import flags
from rn50.errors import RecipeError
from rn50.nets import layers
from rn50.nets.catalogue import ARCHITECTURES, RESNET_DEPTHS, RESNEXT_WIDTH_PER_GROUP
from rn50.nets.layers import Builder, Stack
from rn50.nets.network import Network

log = logging.getLogger(__name__)

LAYOUTS = ('NCHW', 'NHWC')
STAGE_CHANNELS = {'basic': (64, 128, 256, 512), 'bottleneck': (256, 512, 1024, 2048)}

# (widths of the separable convolutions, downsampling?) of Xception's twelve blocks
XCEPTION_BLOCKS = ([((128, 128), True), ((256, 256), True), ((728, 728), True)] + [((728, 728, 728), False)] * 8
                   + [((728, 1024), True)])


# ----------------------------------------------------------------------------------------------------------
# Flags


def add_model_args(parser):
    """The 'Model' flag group (names and defaults of the original recipe)."""
    group = parser.add_argument_group('Model', 'model configuration')
    group.add_argument('--arch', default='resnetv15', choices=ARCHITECTURES, help='model architecture')
    group.add_argument('--num-layers', type=flags.integer(minimum=1), default=50,
                       help='number of layers in the neural network, required by some networks such as resnet '
                            '(ResNet: 10, 18, 34, 50, 101, 152; ResNeXt: 50, 101, 152; Xception has a fixed depth)')
    group.add_argument('--num-groups', type=flags.integer(minimum=1), default=32,
                       help='number of groups for grouped convolutions, required by some networks such as '
                            'resnext (ResNeXt-N 32x4d has 32)')
    group.add_argument('--num-classes', type=flags.integer(minimum=2), default=None,
                       help='the number of classes (default: the count of the classes.json beside --data-train '
                            'or --data-val, as prepare_dataset.py writes it; else, and with --data-backend synthetic, 1000)')
    group.add_argument('--drop-path', type=flags.real(minimum=0, maximum=1, exclusive=True), default=0.0,
                       help='stochastic depth (ResNet, ResNeXt): in training, residual unit k of n skips its body '
                            'for a sample with probability R x k / (n - 1), as timm; off in val, pred and export')
    group.add_argument('--init', default='nvidia', choices=sorted(layers.CLASSIFIER_INIT),
                       help='the initialisation: nvidia (default), He-normal (Xavier gaussian, fan-in, magnitude 2) for the '
                            'convolutions and the classifier (the original recipe\'s); mlperf, the same for the '
                            'convolutions and N(0, 0.01) for the classifier (NVIDIA\'s MLPerf MXNet code)')
    group.add_argument('--zero-gamma', type=int, default=1, choices=(0, 1),
                       help='1 (default): the last batchnorm of each residual unit starts at gamma 0, so every unit '
                            'starts as the identity (the original recipe\'s, timm\'s zero_init_last); 0: at gamma 1 '
                            'like every other batchnorm (torchvision\'s v2 recipe, MLPerf\'s)')
    group.add_argument('--batchnorm-eps', type=flags.real(minimum=0, exclusive=True), default=1e-5,
                       help='the amount added to the batchnorm variance to prevent output explosion.')
    group.add_argument('--batchnorm-mom', type=flags.real(minimum=0, maximum=1), default=0.9,
                       help='the leaky-integrator factor controling the batchnorm mean and variance.')
    group.add_argument('--fuse-bn-relu', type=int, default=0, choices=(0, 1),
                       help='have batchnorm kernel perform activation relu (GPU: needs NVIDIA\'s MXNet build; '
                            'CPU: oneDNN, NCHW batchnorm only)')
    group.add_argument('--fuse-bn-add-relu', type=int, default=0, choices=(0, 1),
                       help='have batchnorm kernel perform add followed by activation relu (GPU: needs '
                            'NVIDIA\'s MXNet build; CPU: no such kernel, composed in one block)')
    return group


# ----------------------------------------------------------------------------------------------------------
# The classifier around every architecture


class Classifier(HybridBlock):
    """features -> dense logits. Built inside its own name scope (`name` prefixes every parameter name, e.g.
    'resnetv15_50_conv0_weight', whatever else the process has built). After cast('float16') the logits are
    cast back to float32 here, so float16 adds no wrapper level and the parameter names stay the same."""

    def __init__(self, name, make_features, builder, num_classes, **feature_options):
        super().__init__(prefix=f'{name}_')
        self.float32_logits = False
        with self.name_scope():
            layers, width = make_features(builder, **feature_options)
            self.features = Stack(layers)
            self.output = builder.dense(num_classes, width)

    def cast(self, dtype):
        super().cast(dtype)
        self.float32_logits = np.dtype(dtype) != np.float32

    def hybrid_forward(self, F, x):
        logits = self.output(self.features(x))
        return F.cast(logits, dtype='float32') if self.float32_logits else logits


# ----------------------------------------------------------------------------------------------------------
# ResNet and ResNeXt


class ResidualUnit(HybridBlock):
    """relu(final_bn(body(x)) + shortcut(x)): the final batchnorm, the addition and the ReLU are one block."""

    def __init__(self, body, final_bn, shortcut):
        super().__init__()
        self.body = Stack(body)
        self.final_bn = final_bn
        self.shortcut = Stack(shortcut) if shortcut else None

    def hybrid_forward(self, F, x):
        shortcut = x if self.shortcut is None else self.shortcut(x)
        return self.final_bn(self.body(x), shortcut)


def basic_body(builder, in_channels, channels, stride):
    """Two 3x3 convolutions, the stride on the first (ResNet-10/18/34, v1 and v1.5 alike)."""
    return (builder.conv('conv1', channels, 3, stride, 1, in_channels=in_channels) +
            builder.batchnorm_relu('bn1', channels) +
            builder.conv('conv2', channels, 3, 1, 1, in_channels=channels))


def bottleneck_body(builder, in_channels, channels, stride, stride_on_3x3, width, groups):
    """1x1 (width), 3x3 (width, `groups` groups), 1x1 (channels); the stride on the 3x3 (v1.5) or the first 1x1
    (v1)."""
    stride_1x1, stride_3x3 = (1, stride) if stride_on_3x3 else (stride, 1)
    return (builder.conv('conv1', width, 1, stride_1x1, in_channels=in_channels) +
            builder.batchnorm_relu('bn1', width) +
            builder.conv('conv2', width, 3, stride_3x3, 1, groups=groups, in_channels=width) +
            builder.batchnorm_relu('bn2', width) +
            builder.conv('conv3', channels, 1, in_channels=width))


def residual_unit(builder, kind, in_channels, channels, stride, stride_on_3x3, width, groups, drop_rate):
    """A 'basic' or 'bottleneck' unit with an identity shortcut, or a 1x1 projection (conv + batchnorm) where the
    stride or the channel count changes; its body dropped per sample with `drop_rate` in training."""
    entry = builder.fork()
    if kind == 'basic':
        body = basic_body(builder, in_channels, channels, stride)
    else:
        body = bottleneck_body(builder, in_channels, channels, stride, stride_on_3x3, width, groups)
    final_transposes, final_bn = builder.batchnorm_add_relu('final_bn', channels, drop_rate)
    shortcut = []
    if stride != 1 or in_channels != channels:
        shortcut = (entry.conv('conv', channels, 1, stride, in_channels=in_channels) +
                    entry.batchnorm('bn', channels))
    return ResidualUnit(body + final_transposes, final_bn, shortcut + entry.follow(builder))


def resnet_features(builder, num_layers, in_channels, stride_on_3x3, groups=1, width_per_group=None,
                    drop_path=0.0):
    """Stem (7x7/2 conv 64, batchnorm-ReLU, 3x3/2 max-pool), four stages (stride 2 from the second on) and
    global average pooling. Bottleneck width: channels / 4 (ResNet) or groups * width_per_group * 2**stage
    (ResNeXt). Stochastic depth as timm: unit k of n drops its body with drop_path * k / (n - 1). Returns the
    layers and the feature width."""
    kind, units_per_stage = RESNET_DEPTHS[num_layers]
    drop_rates = iter(np.linspace(0, drop_path, sum(units_per_stage)))
    layers = (builder.conv('conv0', 64, 7, 2, 3, in_channels=in_channels) + builder.batchnorm_relu('bn0', 64) +
              builder.max_pool('pool0'))
    channels = 64
    for stage, (units, out_channels) in enumerate(zip(units_per_stage, STAGE_CHANNELS[kind])):
        width = groups * width_per_group * 2 ** stage if width_per_group else out_channels // 4
        stage_units = []
        for i in range(units):
            stride = 2 if stage > 0 and i == 0 else 1
            stage_units.append((f'unit{i + 1}', residual_unit(builder, kind, channels, out_channels, stride,
                                                              stride_on_3x3, width, groups, next(drop_rates))))
            channels = out_channels
        layers.append((f'stage{stage + 1}', Stack(stage_units)))
    return layers + builder.global_avg_pool('pool1'), channels


def resnet(name, num_layers, stride_on_3x3, num_classes, in_channels, builder, drop_path):
    if num_layers not in RESNET_DEPTHS:
        raise RecipeError(f'--num-layers {num_layers}: ResNet comes in depths '
                          f'{", ".join(map(str, RESNET_DEPTHS))}')
    return Classifier(f'{name}_{num_layers}', resnet_features, builder or Builder(), num_classes,
                      num_layers=num_layers, in_channels=in_channels, stride_on_3x3=stride_on_3x3,
                      drop_path=drop_path)


def resnetv1(num_layers=50, num_classes=1000, in_channels=3, builder=None, drop_path=0.0):
    r"""ResNet v1 from "Deep Residual Learning for Image Recognition" (He et al., 2015): the downsampling
    stride of a bottleneck sits on its first 1x1 convolution.

    Parameters
    ----------
    num_layers : int, default 50
        18 or 34 (basic units), 50, 101 or 152 (bottleneck units).
    num_classes : int, default 1000
        Width of the classifier.
    in_channels : int, default 3
        Input channels of the stem convolution (4 for the zero-padded input of the NHWC float16 path).
    builder : Builder, optional
        Layouts, batchnorm settings and kernels; default: NCHW everywhere, unfused.
    drop_path : float, default 0
        Stochastic depth in training: residual unit k of n skips its body for a sample with probability
        drop_path * k / (n - 1) (timm's rule); off in inference.

    Trainable parameters (1000 classes, 3 input channels), the same as v1.5: 11,689,512 (18),
    21,797,672 (34), 25,557,032 (50), 44,549,160 (101), 60,192,808 (152).
    """
    return resnet('resnetv1', num_layers, False, num_classes, in_channels, builder, drop_path)


def resnetv15(num_layers=50, num_classes=1000, in_channels=3, builder=None, drop_path=0.0):
    r"""ResNet v1.5 (the recipe's default): ResNet v1 with the downsampling stride of a bottleneck on its 3x3
    convolution instead of the first 1x1 (about 0.5% more top-1, about 5% slower). Basic units (18, 34) are
    the same as v1's.

    Parameters
    ----------
    num_layers : int, default 50
        18 or 34 (basic units), 50, 101 or 152 (bottleneck units).
    num_classes : int, default 1000
        Width of the classifier.
    in_channels : int, default 3
        Input channels of the stem convolution (4 for the zero-padded input of the NHWC float16 path).
    builder : Builder, optional
        Layouts, batchnorm settings and kernels; default: NCHW everywhere, unfused.
    drop_path : float, default 0
        Stochastic depth in training: residual unit k of n skips its body for a sample with probability
        drop_path * k / (n - 1) (timm's rule); off in inference.

    Trainable parameters (1000 classes): 25,557,032 for ResNet-50 (25,560,168 with 4 input channels);
    11,689,512 (18), 21,797,672 (34), 44,549,160 (101), 60,192,808 (152).
    """
    return resnet('resnetv15', num_layers, True, num_classes, in_channels, builder, drop_path)


def resnext(name, num_layers, num_groups, stride_on_3x3, num_classes, in_channels, builder, drop_path):
    if RESNET_DEPTHS.get(num_layers, ('',))[0] != 'bottleneck':
        raise RecipeError(f'--num-layers {num_layers}: ResNeXt is built from bottleneck units and comes in depths '
                          '50, 101 and 152')
    if num_groups < 1:
        raise RecipeError(f'--num-groups {num_groups}: ResNeXt needs at least one group')
    return Classifier(f'{name}_{num_layers}_{num_groups}x{RESNEXT_WIDTH_PER_GROUP}d', resnet_features,
                      builder or Builder(), num_classes, num_layers=num_layers, in_channels=in_channels,
                      stride_on_3x3=stride_on_3x3, groups=num_groups, width_per_group=RESNEXT_WIDTH_PER_GROUP,
                      drop_path=drop_path)


def resnextv1(num_layers=50, num_groups=32, num_classes=1000, in_channels=3, builder=None, drop_path=0.0):
    r"""ResNeXt from "Aggregated Residual Transformations for Deep Neural Networks" (Xie et al., 2017): ResNet
    bottlenecks whose 3x3 convolution has `num_groups` groups of 4 channels in the first stage, doubling per
    stage (bottleneck width num_groups * 4 * 2**stage, e.g. 128..1024 for 32x4d). As in the recipe's v1/v1.5
    naming, v1 puts the downsampling stride on the first 1x1 convolution.

    Parameters
    ----------
    num_layers : int, default 50
        50, 101 or 152.
    num_groups : int, default 32
        Groups of the 3x3 convolutions (the cardinality).
    num_classes : int, default 1000
        Width of the classifier.
    in_channels : int, default 3
        Input channels of the stem convolution.
    builder : Builder, optional
        Layouts, batchnorm settings and kernels; default: NCHW everywhere, unfused.
    drop_path : float, default 0
        Stochastic depth in training: residual unit k of n skips its body for a sample with probability
        drop_path * k / (n - 1) (timm's rule); off in inference.

    Trainable parameters (1000 classes), the same as v1.5: 25,028,904 for ResNeXt-50 32x4d, 44,177,704 for
    ResNeXt-101 32x4d.
    """
    return resnext('resnextv1', num_layers, num_groups, False, num_classes, in_channels, builder, drop_path)


def resnextv15(num_layers=50, num_groups=32, num_classes=1000, in_channels=3, builder=None, drop_path=0.0):
    r"""ResNeXt (Xie et al., 2017) with the downsampling stride on the grouped 3x3 convolution, as the paper's
    reference implementation has it; otherwise the same as `resnextv1`.

    Parameters
    ----------
    num_layers : int, default 50
        50, 101 or 152.
    num_groups : int, default 32
        Groups of the 3x3 convolutions (the cardinality).
    num_classes : int, default 1000
        Width of the classifier.
    in_channels : int, default 3
        Input channels of the stem convolution.
    builder : Builder, optional
        Layouts, batchnorm settings and kernels; default: NCHW everywhere, unfused.
    drop_path : float, default 0
        Stochastic depth in training: residual unit k of n skips its body for a sample with probability
        drop_path * k / (n - 1) (timm's rule); off in inference.

    Trainable parameters (1000 classes): 25,028,904 for ResNeXt-50 32x4d, 44,177,704 for ResNeXt-101 32x4d.
    """
    return resnext('resnextv15', num_layers, num_groups, True, num_classes, in_channels, builder, drop_path)


# ----------------------------------------------------------------------------------------------------------
# Xception


class XceptionBlock(HybridBlock):
    """body(x) + shortcut(x): the shortcut is a 1x1/2 projection where the body downsamples, else the identity,
    in both cases brought to the body's output layout."""

    def __init__(self, body, shortcut):
        super().__init__()
        self.body = Stack(body)
        self.shortcut = Stack(shortcut) if shortcut else None

    def hybrid_forward(self, F, x):
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


def separable_conv(builder, name, in_channels, channels):
    """3x3 depthwise then 1x1 pointwise convolution, no batchnorm in between."""
    return (builder.conv(f'{name}_depthwise', in_channels, 3, 1, 1, groups=in_channels, in_channels=in_channels) +
            builder.conv(f'{name}_pointwise', channels, 1, in_channels=in_channels))


def xception_block(builder, in_channels, widths, downsample, leading_relu):
    """[ReLU], then per width a separable convolution and batchnorm-ReLU, except the last, whose batchnorm has
    gamma 0 (--zero-gamma) and no ReLU; then a 3x3/2 max-pool if the block downsamples."""
    entry = builder.fork()
    body = [('relu', nn.Activation('relu'))] if leading_relu else []
    channels = in_channels
    for i, width in enumerate(widths, start=1):
        body += separable_conv(builder, f'sepconv{i}', channels, width)
        if i < len(widths):
            body += builder.batchnorm_relu(f'bn{i}', width)
        else:
            body += builder.batchnorm(f'bn{i}', width, last_of_unit=True)
        channels = width
    shortcut = []
    if downsample:
        body += builder.max_pool('pool')
        shortcut = (entry.conv('conv', channels, 1, 2, in_channels=in_channels) +
                    entry.batchnorm('bn', channels))
    return XceptionBlock(body, shortcut + entry.follow(builder))


def xception_features(builder, in_channels):
    """Entry 3x3/2 conv 32 and 3x3 conv 64 (each with batchnorm-ReLU, padding 1), the twelve blocks of
    XCEPTION_BLOCKS (ReLU first except in the first), exit separable convolutions 1536 and 2048 with
    batchnorm-ReLU, global average pooling."""
    layers = (builder.conv('conv1', 32, 3, 2, 1, in_channels=in_channels) + builder.batchnorm_relu('bn1', 32) +
              builder.conv('conv2', 64, 3, 1, 1, in_channels=32) + builder.batchnorm_relu('bn2', 64))
    channels = 64
    for i, (widths, downsample) in enumerate(XCEPTION_BLOCKS):
        layers.append((f'block{i + 1}', xception_block(builder, channels, widths, downsample, leading_relu=i > 0)))
        channels = widths[-1]
    layers += (separable_conv(builder, 'sepconv1', channels, 1536) + builder.batchnorm_relu('bn3', 1536) +
               separable_conv(builder, 'sepconv2', 1536, 2048) + builder.batchnorm_relu('bn4', 2048) +
               builder.global_avg_pool('pool'))
    return layers, 2048


def xception(num_classes=1000, in_channels=3, builder=None):
    r"""Xception from "Xception: Deep Learning with Depthwise Separable Convolutions" (Chollet, 2017), as the
    original recipe builds it: the paper's network with no bias in the convolutions, zero-gamma batchnorm at
    the end of every block, and the input size of --image-shape (224 by default, not the paper's 299). Unlike
    the original, a shortcut that needs a layout transpose applies it.

    Parameters
    ----------
    num_classes : int, default 1000
        Width of the classifier.
    in_channels : int, default 3
        Input channels of the first convolution.
    builder : Builder, optional
        Layouts, batchnorm settings and kernels; default: NCHW everywhere, unfused.

    Trainable parameters (1000 classes): 22,855,952 (the same as Keras' Xception, which has this structure).
    """
    return Classifier('xception', xception_features, builder or Builder(), num_classes, in_channels=in_channels)


# ----------------------------------------------------------------------------------------------------------
# The entry point


def check_network(network, device):
    """RecipeError for flag values no network can have; conv layout NHWC on the CPU is one of them."""
    if device not in ('cpu', 'gpu'):
        raise ValueError(f'device must be cpu or gpu, not {device!r}')
    if network.arch not in ARCHITECTURES:
        raise RecipeError(f'--arch {network.arch}: choose one of {", ".join(ARCHITECTURES)}')
    if network.num_classes < 1:
        raise RecipeError(f'--num-classes {network.num_classes}: need at least one class')
    if network.batchnorm_eps <= 0 or not 0 <= network.batchnorm_mom <= 1:
        raise RecipeError(f'--batchnorm-eps {network.batchnorm_eps} --batchnorm-mom {network.batchnorm_mom}: the '
                          'epsilon must be positive and the momentum in [0, 1]')
    layouts = {'input-layout': network.input_layout, 'conv-layout': network.conv_layout,
               'batchnorm-layout': network.batchnorm_layout, 'pooling-layout': network.pooling_layout}
    for flag, layout in layouts.items():
        if layout not in LAYOUTS:
            raise RecipeError(f'--{flag} {layout}: choose NCHW or NHWC')
    if device == 'cpu' and network.conv_layout == 'NHWC':
        raise RecipeError('--conv-layout NHWC: MXNet 1.9.1 runs NHWC convolutions on GPU only (oneDNN refuses '
                          'them); use --conv-layout NCHW on the CPU (NHWC input, batchnorm and pooling work there)')
    if len(network.image_shape) != 3 or network.image_shape[0] not in (3, 4):
        raise RecipeError(f'--image-shape {",".join(map(str, network.image_shape))}: expected C,H,W with C = 3, or '
                          '4 for a zero 4th channel')
    if network.dtype not in ('float32', 'float16'):
        raise RecipeError(f'--dtype {network.dtype}: choose float32 or float16')


def build(network, device='cpu'):
    """An uninitialised network (HybridBlock) of `network` (a nets.network.Network) on `device`.

    It takes (N, C, H, W) or (N, H, W, C) input per `network.input_layout`, of `network.dtype`, with
    C = image_shape[0], and returns float32 logits (N, num_classes). `device` ('cpu' or 'gpu') decides which
    layouts and fused kernels exist; a request the installed MXNet cannot honour on it is a RecipeError. float16
    casts every parameter but the batchnorm ones. The composer hands `functools.partial(models.build,
    device=...)` to the code in rn50/ that builds a network of its own (export's portable form, distillation's
    teacher: `dataclasses.replace` of the run's Network)."""
    check_network(network, device)
    builder = Builder(network.input_layout, network.conv_layout, network.batchnorm_layout, network.pooling_layout,
                      network.batchnorm_eps, network.batchnorm_mom,
                      layers.bn_relu_kernel(network.fuse_bn_relu, device, network.batchnorm_layout),
                      layers.bn_add_relu_kernel(network.fuse_bn_add_relu, device), network.init, network.zero_gamma)
    common = dict(num_classes=network.num_classes, in_channels=network.image_shape[0], builder=builder)
    if network.arch == 'xception':
        if network.drop_path:
            raise RecipeError('--drop-path: stochastic depth is built for ResNet and ResNeXt, not --arch xception')
        net = xception(**common)
    elif network.arch in ('resnextv1', 'resnextv15'):
        factory = resnextv1 if network.arch == 'resnextv1' else resnextv15
        net = factory(num_layers=network.num_layers, num_groups=network.num_groups, drop_path=network.drop_path,
                      **common)
    else:
        factory = resnetv1 if network.arch == 'resnetv1' else resnetv15
        net = factory(num_layers=network.num_layers, drop_path=network.drop_path, **common)
    if network.dtype == 'float16':
        net.cast('float16')     # Gluon keeps batchnorm parameters in float32
    return net


def get_model(*settings, device='cpu', **named_settings):
    """build's keyword form, for a network written out by hand: get_model('resnetv1', 101, num_classes=10,
    device='gpu') is build(Network('resnetv1', 101, num_classes=10), 'gpu'); the defaults (Network's) make
    ResNet-50 v1.5 on the CPU."""
    return build(Network(*settings, **named_settings), device)
