"""The networks: ResNet v1 / v1.5, ResNeXt and Xception, with layouts, fused batchnorm ops and float16.

    import models
    net = models.get_model()                       # ResNet-50 v1.5, 1000 classes, NCHW, float32
    net = models.get_model('resnextv15', 50, num_groups=32)
    net.initialize()                               # every parameter carries its own initializer
    python train.py --arch resnetv1 --num-layers 101 ...   # the same through the Model flags

`get_model` returns an uninitialised Gluon HybridBlock. Every architecture has a factory (`resnet`,
`resnext`, `xception`) documented below. What every network shares:

* Initialisation as the original recipe: He-normal (fan-in) convolution and dense weights, zero dense bias,
  batchnorm gamma 1 and beta 0, except the last batchnorm of every residual body, whose gamma starts at 0 so
  each block starts as the identity.
* No weight decay on batchnorm gamma/beta and on biases (`wd_mult = 0` on those parameters, so any Trainer
  honours it; the original recipe claimed this but never did it).
* Layouts: a `Builder` tracks the layout of the activations and inserts a transpose only where the next
  layer's configured layout differs, so NCHW and NHWC networks come from the same code. MXNet runs NHWC
  convolution and pooling on GPU only.
* Fused batchnorm ops: NVIDIA's MXNet build has BatchNorm with `act_type` (BN+ReLU) and a `BatchNormAddRelu`
  operator; stock MXNet has `nn.BatchNormReLU` (oneDNN, CPU only). `fused_ops_available()` says which the
  installed MXNet offers; an explicit request it cannot honour is a RecipeError. Fused and unfused networks
  have the same parameter names and compute the same function.
* float16: parameters cast to float16 except batchnorm (kept float32 by Gluon), logits returned as float32.
"""
import functools
import inspect

import mxnet as mx
from mxnet.gluon import nn
from mxnet.gluon.block import HybridBlock

from errors import RecipeError

ARCHITECTURES = ('resnetv1', 'resnetv15', 'resnextv1', 'resnextv15', 'xception')

# depth -> (residual block kind, blocks per stage)
RESNET_DEPTHS = {18: ('basic', [2, 2, 2, 2]), 34: ('basic', [3, 4, 6, 3]), 50: ('bottleneck', [3, 4, 6, 3]),
                 101: ('bottleneck', [3, 4, 23, 3]), 152: ('bottleneck', [3, 8, 36, 3])}

HE_NORMAL = mx.init.Xavier(rnd_type='gaussian', factor_type='in', magnitude=2)


def str2bool(text):
    return str(text).lower() in ('1', 'true', 'yes')


def add_model_args(parser):
    group = parser.add_argument_group('Model', 'model configuration')
    group.add_argument('--arch', default='resnetv15', choices=ARCHITECTURES, help='model architecture')
    group.add_argument('--num-layers', type=int, default=50,
                       help='number of layers in the neural network, required by some networks such as resnet')
    group.add_argument('--num-groups', type=int, default=32,
                       help='number of groups for grouped convolutions, required by some networks such as '
                            'resnext')
    group.add_argument('--num-classes', type=int, default=1000, help='the number of classes')
    group.add_argument('--batchnorm-eps', type=float, default=1e-5,
                       help='the amount added to the batchnorm variance to prevent output explosion.')
    group.add_argument('--batchnorm-mom', type=float, default=0.9,
                       help='the leaky-integrator factor controling the batchnorm mean and variance.')
    group.add_argument('--fuse-bn-relu', type=str2bool, default=False,
                       help='have batchnorm kernel perform activation relu')
    group.add_argument('--fuse-bn-add-relu', type=str2bool, default=False,
                       help='have batchnorm kernel perform add followed by activation relu')
    return group


def model_options(args):
    """get_model's keyword arguments from parsed flags (args.device is set by fit.resolve_hardware)."""
    return dict(arch=args.arch, num_layers=args.num_layers, num_classes=args.num_classes,
                num_groups=args.num_groups, batchnorm_eps=args.batchnorm_eps, batchnorm_mom=args.batchnorm_mom,
                fuse_bn_relu=args.fuse_bn_relu, fuse_bn_add_relu=args.fuse_bn_add_relu,
                input_layout=args.input_layout, conv_layout=args.conv_layout,
                batchnorm_layout=args.batchnorm_layout, pooling_layout=args.pooling_layout,
                image_shape=tuple(args.image_shape), dtype=args.dtype, device=args.device)


@functools.lru_cache(maxsize=None)
def fused_ops_available():
    """Which fused batchnorm kernels the installed MXNet has: NVIDIA's build (GPU) and oneDNN's (CPU)."""
    return {'nvidia_bn_relu': 'act_type' in inspect.signature(nn.BatchNorm.__init__).parameters,
            'nvidia_bn_add_relu': hasattr(mx.nd, 'BatchNormAddRelu'),
            'onednn_bn_relu': hasattr(nn, 'BatchNormReLU') and mx.runtime.Features().is_enabled('MKLDNN')}


# ----------------------------------------------------------------------------------------------------------
# Building blocks


class Transpose(HybridBlock):
    """Change the activation layout between NCHW and NHWC."""

    def __init__(self, source, target):
        super().__init__()
        self.axes = (0, 2, 3, 1) if (source, target) == ('NCHW', 'NHWC') else (0, 3, 1, 2)

    def hybrid_forward(self, F, x):
        return F.transpose(x, axes=self.axes)


class BatchNormAddReLU(nn.BatchNorm):
    """relu(batchnorm(x) + addend) as one block: NVIDIA's BatchNormAddRelu kernel where the installed MXNet has
    it (GPU), else the three ops composed. Same parameters as nn.BatchNorm."""

    def __init__(self, use_nvidia_kernel, **kwargs):
        super().__init__(**kwargs)
        self.use_nvidia_kernel = use_nvidia_kernel

    def hybrid_forward(self, F, x, addend, gamma, beta, running_mean, running_var):
        if self.use_nvidia_kernel:
            return F.BatchNormAddRelu(x, addend, gamma, beta, running_mean, running_var, name='fwd',
                                      **self._kwargs)
        normalised = F.BatchNorm(x, gamma, beta, running_mean, running_var, name='fwd', **self._kwargs)
        return F.relu(normalised + addend)


class BatchNormThenReLU(nn.BatchNorm):
    """batchnorm then ReLU as two ops in one block, so unfused and fused networks share parameter names."""

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        return F.relu(F.BatchNorm(x, gamma, beta, running_mean, running_var, name='fwd', **self._kwargs))


class Builder:
    """Makes layers in the configured layouts, precision-independent, with the recipe's initialisation and
    weight-decay rules, and tracks the activation layout to insert transposes only where needed.

    `layout` is the layout of the activations produced by the layers built so far; `fork()` copies the
    builder so the two branches of a residual block start from the same layout."""

    def __init__(self, input_layout='NCHW', conv_layout='NCHW', batchnorm_layout='NCHW', pooling_layout='NCHW',
                 batchnorm_eps=1e-5, batchnorm_mom=0.9, fuse_bn_relu=False, fuse_bn_add_relu=False,
                 device='cpu'):
        if device == 'cpu' and 'NHWC' in (conv_layout, pooling_layout):
            raise RecipeError('MXNet runs NHWC convolution and pooling on GPU only: use --conv-layout NCHW '
                              '--batchnorm-layout NCHW --pooling-layout NCHW on the CPU')
        self.layout = input_layout
        self.conv_layout, self.bn_layout, self.pool_layout = conv_layout, batchnorm_layout, pooling_layout
        self.eps, self.momentum = batchnorm_eps, batchnorm_mom
        self.bn_relu_kind = bn_relu_kind(fuse_bn_relu, device)
        self.bn_add_relu_kind = bn_add_relu_kind(fuse_bn_add_relu, device)

    def fork(self):
        twin = Builder.__new__(Builder)
        twin.__dict__.update(self.__dict__)
        return twin

    def to_layout(self, layout):
        """[] or [a transpose] that brings the activations to `layout`."""
        if layout == self.layout:
            return []
        block = Transpose(self.layout, layout)
        self.layout = layout
        return [block]

    def conv(self, channels, kernel, stride=1, padding=0, groups=1, in_channels=0):
        return self.to_layout(self.conv_layout) + [
            nn.Conv2D(channels, kernel, strides=stride, padding=padding, groups=groups, use_bias=False,
                      layout=self.conv_layout, in_channels=in_channels, weight_initializer=HE_NORMAL)]

    def _bn_options(self, channels, zero_gamma):
        return dict(axis=3 if self.bn_layout == 'NHWC' else 1, momentum=self.momentum, epsilon=self.eps,
                    in_channels=channels, gamma_initializer='zeros' if zero_gamma else 'ones')

    def batchnorm(self, channels, zero_gamma=False):
        return self.to_layout(self.bn_layout) + [no_weight_decay(nn.BatchNorm(
            **self._bn_options(channels, zero_gamma)))]

    def batchnorm_relu(self, channels):
        layers = self.to_layout(self.bn_layout)
        options = self._bn_options(channels, False)
        if self.bn_relu_kind == 'nvidia':
            return layers + [no_weight_decay(nn.BatchNorm(act_type='relu', **options))]
        if self.bn_relu_kind == 'onednn':
            return layers + [no_weight_decay(nn.BatchNormReLU(**options))]
        return layers + [no_weight_decay(BatchNormThenReLU(**options))]

    def batchnorm_add_relu(self, channels):
        """The block-final batchnorm of a residual body, gamma 0; fused with the add and ReLU on request."""
        layers = self.to_layout(self.bn_layout)
        options = self._bn_options(channels, zero_gamma=True)
        if self.bn_add_relu_kind is None:
            return layers, no_weight_decay(nn.BatchNorm(**options))
        return layers, no_weight_decay(BatchNormAddReLU(self.bn_add_relu_kind == 'nvidia', **options))

    def max_pool(self, size=3, stride=2, padding=1):
        return self.to_layout(self.pool_layout) + [nn.MaxPool2D(size, stride, padding, layout=self.pool_layout)]

    def global_avg_pool(self):
        return self.to_layout(self.pool_layout) + [nn.GlobalAvgPool2D(layout=self.pool_layout)]

    def dense(self, units, in_units):
        return [no_weight_decay(nn.Dense(units, in_units=in_units, weight_initializer=HE_NORMAL,
                                         bias_initializer='zeros'), names=('bias',))]


def bn_relu_kind(requested, device):
    if not requested:
        return None
    available = fused_ops_available()
    if device == 'gpu' and available['nvidia_bn_relu']:
        return 'nvidia'
    if device == 'cpu' and available['onednn_bn_relu']:
        return 'onednn'
    raise RecipeError(f'--fuse-bn-relu 1: the installed MXNet has no fused BatchNorm+ReLU kernel for the '
                      f'{device.upper()} (NVIDIA\'s MXNet build has one for GPUs, oneDNN builds for CPUs); '
                      'pass --fuse-bn-relu 0')


def bn_add_relu_kind(requested, device):
    if not requested:
        return None
    if device == 'cpu':
        return 'composed'
    if fused_ops_available()['nvidia_bn_add_relu']:
        return 'nvidia'
    raise RecipeError('--fuse-bn-add-relu 1: the installed MXNet has no BatchNormAddRelu kernel (it comes with '
                      'NVIDIA\'s MXNet build); pass --fuse-bn-add-relu 0')


def no_weight_decay(block, names=('gamma', 'beta')):
    """Exempt the block's batchnorm scale/shift (or bias) from weight decay."""
    for name in names:
        getattr(block, name).wd_mult = 0.0
    return block


def sequential(layers):
    block = nn.HybridSequential()
    for layer in layers:
        block.add(layer)
    return block


# ----------------------------------------------------------------------------------------------------------
# ResNet and ResNeXt


class Residual(HybridBlock):
    """out = relu(final_bn(body(x)) + shortcut(x)), the batchnorm/add/ReLU optionally one fused op."""

    def __init__(self, body_layers, final_layers, final_bn, shortcut_layers, fused):
        super().__init__()
        self.body = sequential(body_layers + final_layers)
        self.final_bn = final_bn
        self.shortcut = sequential(shortcut_layers) if shortcut_layers else None
        self.fused = fused

    def hybrid_forward(self, F, x):
        shortcut = self.shortcut(x) if self.shortcut is not None else x
        if self.fused:
            return self.final_bn(self.body(x), shortcut)
        return F.relu(self.final_bn(self.body(x)) + shortcut)


def residual_block(builder, kind, in_channels, out_channels, stride, version, groups=1, width=None):
    """One residual block. kind: 'basic' (two 3x3) or 'bottleneck' (1x1, 3x3 with `groups`, 1x1). The
    downsampling stride sits on the first 1x1 for v1 and on the 3x3 for v1.5."""
    entry = builder.fork()
    if kind == 'basic':
        body = (builder.conv(out_channels, 3, stride, 1, in_channels=in_channels) +
                builder.batchnorm_relu(out_channels) +
                builder.conv(out_channels, 3, 1, 1, in_channels=out_channels))
    else:
        width = width or out_channels // 4
        stride_1x1, stride_3x3 = (stride, 1) if version == 1 else (1, stride)
        body = (builder.conv(width, 1, stride_1x1, in_channels=in_channels) + builder.batchnorm_relu(width) +
                builder.conv(width, 3, stride_3x3, 1, groups=groups, in_channels=width) +
                builder.batchnorm_relu(width) +
                builder.conv(out_channels, 1, in_channels=width))
    final_layers, final_bn = builder.batchnorm_add_relu(out_channels)
    if stride != 1 or in_channels != out_channels:
        shortcut = entry.conv(out_channels, 1, stride, in_channels=in_channels) + entry.batchnorm(out_channels)
    else:
        shortcut = []
    shortcut += entry.to_layout(builder.layout)
    return Residual(body, final_layers, final_bn, shortcut, builder.bn_add_relu_kind is not None)


def stem(builder, in_channels):
    """7x7/2 convolution, batchnorm-ReLU, 3x3/2 max-pool."""
    return (builder.conv(64, 7, 2, 3, in_channels=in_channels) + builder.batchnorm_relu(64) +
            builder.max_pool())


def resnet(builder, num_layers=50, version=1.5, num_classes=1000, in_channels=3, num_groups=1,
           bottleneck_width=None):
    """ResNet (He et al. 2015) of depth 18, 34, 50, 101 or 152; v1 or v1.5 (stride on the bottleneck's 3x3,
    about 0.5% more top-1). With `bottleneck_width`, the 3x3 convolutions are grouped: ResNeXt.

    ResNet-50 v1.5 for 1000 classes has 25,557,032 trainable parameters (25,560,168 with a 4-channel stem).
    Returns the feature extractor layers and the feature width."""
    if num_layers not in RESNET_DEPTHS:
        raise RecipeError(f'--num-layers {num_layers}: ResNet comes in depths {sorted(RESNET_DEPTHS)}')
    kind, blocks_per_stage = RESNET_DEPTHS[num_layers]
    stage_channels = [64, 128, 256, 512] if kind == 'basic' else [256, 512, 1024, 2048]
    layers = stem(builder, in_channels)
    channels = 64
    for stage, (blocks, out_channels) in enumerate(zip(blocks_per_stage, stage_channels)):
        width = num_groups * bottleneck_width * 2 ** stage if bottleneck_width else None
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            layers.append(residual_block(builder, kind, channels, out_channels, stride, version, num_groups,
                                         width))
            channels = out_channels
    return layers + builder.global_avg_pool(), channels


def resnext(builder, num_layers=50, version=1.5, num_classes=1000, in_channels=3, num_groups=32,
            bottleneck_width=4):
    """ResNeXt (Xie et al. 2017): ResNet bottlenecks whose 3x3 convolution has `num_groups` groups of
    `bottleneck_width` channels (doubling per stage). ResNeXt-50 32x4d has 25,028,904 trainable parameters.
    Needs bottleneck depths (50, 101, 152)."""
    if num_layers < 50:
        raise RecipeError(f'ResNeXt needs bottleneck blocks: --num-layers 50, 101 or 152, not {num_layers}')
    return resnet(builder, num_layers, version, num_classes, in_channels, num_groups, bottleneck_width)


# ----------------------------------------------------------------------------------------------------------
# Xception


class XceptionBlock(HybridBlock):
    """Separable convolutions with batchnorm; a 3x3/2 max-pool and a 1x1/2 projection when it downsamples."""

    def __init__(self, builder, in_channels, widths, pool, leading_relu):
        super().__init__()
        entry = builder.fork()
        layers = [nn.Activation('relu')] if leading_relu else []
        channels = in_channels
        for i, width in enumerate(widths):
            layers += separable_conv(builder, channels, width)
            last = i == len(widths) - 1
            layers += builder.batchnorm(width, zero_gamma=True) if last else builder.batchnorm_relu(width)
            channels = width
        if pool:
            layers += builder.max_pool()
        self.body = sequential(layers)
        shortcut = entry.conv(channels, 1, 2, in_channels=in_channels) + entry.batchnorm(channels) if pool else []
        self.shortcut = sequential(shortcut + entry.to_layout(builder.layout))

    def hybrid_forward(self, F, x):
        return self.body(x) + self.shortcut(x)


def separable_conv(builder, in_channels, out_channels):
    """3x3 depthwise then 1x1 pointwise convolution, no batchnorm in between."""
    return (builder.conv(in_channels, 3, 1, 1, groups=in_channels, in_channels=in_channels) +
            builder.conv(out_channels, 1, in_channels=in_channels))


def xception(builder, num_classes=1000, in_channels=3):
    """Xception (Chollet 2017) as the original recipe builds it: entry convolutions 32 and 64, twelve blocks
    ([128,128] [256,256] [728,728] downsampling, eight [728,728,728], [728,1024] downsampling), exit separable
    convolutions 1536 and 2048, global pooling. Input size is --image-shape (224 by default, not the paper's
    299)."""
    layers = (builder.conv(32, 3, 2, 1, in_channels=in_channels) + builder.batchnorm_relu(32) +
              builder.conv(64, 3, 1, 1, in_channels=32) + builder.batchnorm_relu(64))
    plan = [([128, 128], True), ([256, 256], True), ([728, 728], True)] + [([728] * 3, False)] * 8 + \
           [([728, 1024], True)]
    channels = 64
    for i, (widths, pool) in enumerate(plan):
        layers.append(XceptionBlock(builder, channels, widths, pool, leading_relu=i > 0))
        channels = widths[-1]
    layers += (separable_conv(builder, 1024, 1536) + builder.batchnorm_relu(1536) +
               separable_conv(builder, 1536, 2048) + builder.batchnorm_relu(2048) + builder.global_avg_pool())
    return layers, 2048


# ----------------------------------------------------------------------------------------------------------
# The classifier


class Classifier(HybridBlock):
    """[input transpose] -> features -> dense logits; with float16 weights the logits are cast back to float32
    for the loss. The input transpose is not one of the numbered feature layers, so parameter names do not
    depend on --input-layout."""

    def __init__(self, input_transpose, feature_layers, feature_width, num_classes, builder, float16):
        super().__init__()
        self.input_transpose = input_transpose
        self.features = sequential(feature_layers)
        self.output = sequential(builder.dense(num_classes, feature_width))
        self.float16 = float16

    def hybrid_forward(self, F, x):
        if self.input_transpose is not None:
            x = self.input_transpose(x)
        logits = self.output(self.features(x))
        return F.cast(logits, dtype='float32') if self.float16 else logits


def get_model(arch='resnetv15', num_layers=50, num_classes=1000, num_groups=32, batchnorm_eps=1e-5,
              batchnorm_mom=0.9, fuse_bn_relu=False, fuse_bn_add_relu=False, input_layout='NCHW',
              conv_layout='NCHW', batchnorm_layout='NCHW', pooling_layout='NCHW', image_shape=(3, 224, 224),
              dtype='float32', device='cpu'):
    """An uninitialised network for `arch`; every default is the CLI's, so get_model() is ResNet-50 v1.5."""
    if arch not in ARCHITECTURES:
        raise RecipeError(f'--arch {arch}: choose one of {", ".join(ARCHITECTURES)}')
    if image_shape[0] not in (3, 4):
        raise RecipeError(f'--image-shape {image_shape}: 3 channels, or 4 (a zero 4th channel for NHWC '
                          'Tensor Core kernels)')
    # The stem is a convolution: start the features in its layout and transpose the input up front.
    builder = Builder(conv_layout, conv_layout, batchnorm_layout, pooling_layout, batchnorm_eps, batchnorm_mom,
                      fuse_bn_relu, fuse_bn_add_relu, device)
    input_transpose = Transpose(input_layout, conv_layout) if input_layout != conv_layout else None
    in_channels = image_shape[0]
    version = 1 if arch.endswith('v1') else 1.5
    if arch.startswith('resnext'):
        layers, width = resnext(builder, num_layers, version, num_classes, in_channels, num_groups)
    elif arch.startswith('resnet'):
        layers, width = resnet(builder, num_layers, version, num_classes, in_channels)
    else:
        layers, width = xception(builder, num_classes, in_channels)
    net = Classifier(input_transpose, layers, width, num_classes, builder, dtype == 'float16')
    if dtype == 'float16':
        net.cast('float16')  # Gluon keeps batchnorm parameters in float32
    return net
