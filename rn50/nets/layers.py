"""The layers every network is made of, and the `Builder` that makes them: layouts (a transpose only where
the next layer's layout differs), the recipe's initialisation and weight-decay rules, and the batchnorm kernels
the installed MXNet offers (fused with ReLU, or with the residual addition and ReLU). models.py builds the
networks from them:

    builder = layers.Builder(input_layout='NHWC', conv_layout='NHWC', bn_relu_kernel='nvidia')
    body = builder.conv('conv1', 64, 3, 1, 1, in_channels=64) + builder.batchnorm_relu('bn1', 64)
"""
import copy
import functools
import inspect
import logging

import mxnet as mx
from mxnet.gluon import HybridBlock, nn

from rn50.errors import RecipeError

log = logging.getLogger(__name__)

# He-normal: zero-mean Gaussian with variance 2 / fan_in (fan_in = all weight dimensions but the output one,
# so it is the same for OIHW and OHWI weights and counts in-channels per group for grouped convolutions).
HE_NORMAL = mx.init.Xavier(rnd_type='gaussian', factor_type='in', magnitude=2)

# --init: the classifier's weights. nvidia: He-normal like the convolutions (the original recipe's Xavier
# gaussian, fan-in, magnitude 2 everywhere); mlperf: N(0, 0.01), NVIDIA's MLPerf MXNet code (its MLPerfInit,
# the same Xavier for every other weight). Biases start at 0 in both.
CLASSIFIER_INIT = {'nvidia': HE_NORMAL, 'mlperf': mx.init.Normal(0.01)}


# ----------------------------------------------------------------------------------------------------------
# What the installed MXNet offers


@functools.lru_cache(maxsize=None)
def fused_ops_available():
    """Which fused batchnorm kernels the installed MXNet has (probed once):

    * 'nvidia_bn_relu': BatchNorm with an `act_type` argument (NVIDIA's MXNet build, GPU).
    * 'nvidia_bn_add_relu': the `BatchNormAddRelu` operator (NVIDIA's MXNet build, GPU).
    * 'onednn_bn_relu': `contrib.BatchNormWithReLU` in a oneDNN build (stock MXNet 1.9.1, CPU, axis 1 only).
    """
    return {'nvidia_bn_relu': operator_has_argument('BatchNorm', 'act_type'),
            'nvidia_bn_add_relu': hasattr(mx.nd, 'BatchNormAddRelu') and hasattr(mx.sym, 'BatchNormAddRelu'),
            'onednn_bn_relu': (hasattr(mx.nd.contrib, 'BatchNormWithReLU') and
                               mx.runtime.Features().is_enabled('MKLDNN'))}


def operator_has_argument(operator, argument):
    """Whether the imperative and the symbolic form of an MXNet operator both take `argument`."""
    return all(argument in inspect.signature(getattr(api, operator)).parameters for api in (mx.nd, mx.sym))


def bn_relu_kernel(fuse, device, batchnorm_layout):
    """'composed' (BatchNorm then ReLU), 'nvidia' or 'onednn'; RecipeError if a request cannot be honoured."""
    if not fuse:
        return 'composed'
    available = fused_ops_available()
    if device == 'gpu':
        if available['nvidia_bn_relu']:
            return 'nvidia'
        raise RecipeError('--fuse-bn-relu 1 on GPU needs NVIDIA\'s MXNet build (BatchNorm with act_type), which '
                          'this MXNet is not: pass --fuse-bn-relu 0 --fuse-bn-add-relu 0')
    if not available['onednn_bn_relu']:
        raise RecipeError('--fuse-bn-relu 1 on the CPU needs an MXNet built with oneDNN (contrib.BatchNormWithReLU)'
                          ', which this one is not: pass --fuse-bn-relu 0')
    if batchnorm_layout != 'NCHW':
        raise RecipeError('--fuse-bn-relu 1 on the CPU uses oneDNN\'s BatchNormWithReLU, which normalises NCHW '
                          'only: pass --batchnorm-layout NCHW or --fuse-bn-relu 0')
    return 'onednn'


def bn_add_relu_kernel(fuse, device):
    """'composed' (BatchNorm, add, ReLU in one block) or 'nvidia'; RecipeError if a GPU request cannot be met."""
    if not fuse:
        return 'composed'
    if device == 'cpu':
        log.info('--fuse-bn-add-relu 1: MXNet has no fused BatchNorm+add+ReLU kernel for the CPU, the block '
                 'composes BatchNorm, add and ReLU')
        return 'composed'
    if fused_ops_available()['nvidia_bn_add_relu']:
        return 'nvidia'
    raise RecipeError('--fuse-bn-add-relu 1 on GPU needs NVIDIA\'s MXNet build (the BatchNormAddRelu operator), '
                      'which this MXNet is not: pass --fuse-bn-relu 0 --fuse-bn-add-relu 0')


# ----------------------------------------------------------------------------------------------------------
# Layers


class Transpose(HybridBlock):
    """Moves the activations from one layout (NCHW or NHWC) to the other."""

    def __init__(self, source, target):
        super().__init__()
        self.source, self.target = source, target
        self.axes = tuple(source.index(axis) for axis in target)

    def hybrid_forward(self, F, x):
        return F.transpose(x, axes=self.axes)


class Stack(HybridBlock):
    """Named layers applied in order: a HybridSequential whose checkpoint names say what each layer is, and
    whose numbering a layout transpose cannot shift."""

    def __init__(self, layers):
        super().__init__()
        for name, layer in layers:
            if name in self._children:
                raise ValueError(f'two layers named {name!r} in one Stack')
            self.register_child(layer, name)

    def __getitem__(self, name):
        return self._children[name]

    def hybrid_forward(self, F, x):
        for layer in self._children.values():
            x = layer(x)
        return x


def batchnorm_kwargs(block):
    """The operator arguments of a batchnorm block without `act_type`: NVIDIA's MXNet build keeps an `act_type`
    in nn.BatchNorm._kwargs (stock MXNet has none). Passed on as it is, it would collide with the
    act_type='relu' of the fused kernel ("got multiple values for keyword argument"), reach
    BatchNormAddRelu, which takes no act_type, and turn a composed block's BatchNorm into a fused one."""
    return {key: value for key, value in block._kwargs.items() if key != 'act_type'}


class BatchNormReLU(nn.BatchNorm):
    """relu(batchnorm(x)) with `kernel` 'composed' (two ops), 'nvidia' (BatchNorm act_type='relu', NVIDIA's build)
    or 'onednn' (contrib.BatchNormWithReLU, CPU). Same parameters as nn.BatchNorm."""

    def __init__(self, kernel, **kwargs):
        super().__init__(**kwargs)
        self.kernel = kernel

    def _alias(self):
        return 'batchnorm'   # Gluon names parameters after the class: keep the names of nn.BatchNorm

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        kwargs = batchnorm_kwargs(self)
        if self.kernel == 'nvidia':
            return F.BatchNorm(x, gamma, beta, running_mean, running_var, act_type='relu', name='fwd', **kwargs)
        if self.kernel == 'onednn':
            return F.contrib.BatchNormWithReLU(x, gamma, beta, running_mean, running_var, name='fwd', **kwargs)
        normalised = F.BatchNorm(x, gamma, beta, running_mean, running_var, name='fwd', **kwargs)
        # Activation, not F.relu: in MXNet 1.9.1 `relu` has no oneDNN kernel, so each one reordered its input
        # out of oneDNN's blocked layout and back (ResNet-50 224px float32 inference 9 -> 16 img/s), and
        # neither the float32 nor the INT8 graph passes fuse it into the convolution (INT8 1.9x -> 2.8x).
        return F.Activation(normalised, act_type='relu')


class BatchNormAddReLU(nn.BatchNorm):
    """relu(batchnorm(x) + addend) with `kernel` 'composed' (three ops) or 'nvidia' (NVIDIA's BatchNormAddRelu
    operator). Same parameters as nn.BatchNorm. With `drop_rate` (stochastic depth), in training each sample's
    batchnorm output is dropped with that probability and the others scaled by 1 / (1 - rate): one Dropout draw
    per sample, which MXNet applies only in training. Fused, a kept sample's unit is the fused operator with
    gamma and beta scaled by 1 / (1 - rate) (the statistics are the whole batch's either way) and a dropped
    one's relu(addend)."""

    def __init__(self, kernel, drop_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.kernel, self.drop_rate = kernel, drop_rate

    def _alias(self):
        return 'batchnorm'   # Gluon names parameters after the class: keep the names of nn.BatchNorm

    def hybrid_forward(self, F, x, addend, gamma, beta, running_mean, running_var):
        kwargs = batchnorm_kwargs(self)
        if self.kernel == 'nvidia' and self.drop_rate:
            return self.dropped_fused(F, x, addend, gamma, beta, running_mean, running_var, kwargs)
        if self.kernel == 'nvidia':
            return F.BatchNormAddRelu(data=x, addend=addend, gamma=gamma, beta=beta, moving_mean=running_mean,
                                      moving_var=running_var, name='fwd', **kwargs)
        normalised = F.BatchNorm(x, gamma, beta, running_mean, running_var, name='fwd', **kwargs)
        if self.drop_rate:
            normalised = F.Dropout(normalised, p=self.drop_rate, axes=(1, 2, 3))
        return F.Activation(normalised + addend, act_type='relu')   # not F.relu: see BatchNormReLU

    def dropped_fused(self, F, x, addend, gamma, beta, running_mean, running_var, kwargs):
        """Stochastic depth around the fused kernel: `scale`, Dropout of ones, is per sample 0 (dropped) or
        1 / (1 - rate) (kept) in training and 1 in inference; its largest value scales gamma and beta (1 / (1 -
        rate) unless the whole batch is dropped, when the fused output is not used), and each sample takes the
        fused output or relu(addend) by its draw."""
        scale = F.Dropout(F.ones_like(F.slice(x, begin=(None, 0, 0, 0), end=(None, 1, 1, 1))), p=self.drop_rate)
        factor = F.cast(F.max(scale), dtype='float32')   # gamma and beta are float32 in a float16 network too
        fused = F.BatchNormAddRelu(data=x, addend=addend, gamma=F.broadcast_mul(gamma, factor),
                                   beta=F.broadcast_mul(beta, factor), moving_mean=running_mean,
                                   moving_var=running_var, name='fwd', **kwargs)
        kept = scale > 0
        return F.broadcast_mul(fused, kept) + F.broadcast_mul(F.Activation(addend, act_type='relu'), 1 - kept)


def without_weight_decay(block, *names):
    """Exempts the block's parameters `names` from weight decay (every Trainer reads wd_mult)."""
    for name in names:
        getattr(block, name).wd_mult = 0.0
    return block


# ----------------------------------------------------------------------------------------------------------
# The Builder: the one place that decides layouts, initialisation, weight decay and fused kernels


class Builder:
    """Makes layers as (name, block) pairs in their configured layouts, with the recipe's initialisation and
    weight-decay rules and the chosen batchnorm kernels.

    `layout` is the layout of the activations produced by the layers made so far (it starts as the input
    layout); a layer whose layout differs is preceded by a transpose named '<layer>_transpose'. The two
    branches of a residual block start from `fork()` copies; `follow(other)` ends a branch in the other's
    layout so that they can be added."""

    def __init__(self, input_layout='NCHW', conv_layout='NCHW', batchnorm_layout='NCHW', pooling_layout='NCHW',
                 batchnorm_eps=1e-5, batchnorm_mom=0.9, bn_relu_kernel='composed', bn_add_relu_kernel='composed',
                 init='nvidia', zero_gamma=True):
        """`init`: the classifier's initialisation (CLASSIFIER_INIT); `zero_gamma`: whether the last batchnorm of
        every residual unit starts at gamma 0 (else 1, as every other batchnorm)."""
        self.init, self.zero_gamma = init, zero_gamma
        self.layout = input_layout
        self.conv_layout, self.batchnorm_layout, self.pooling_layout = conv_layout, batchnorm_layout, pooling_layout
        self.batchnorm_eps, self.batchnorm_mom = batchnorm_eps, batchnorm_mom
        self.bn_relu_kernel, self.bn_add_relu_kernel = bn_relu_kernel, bn_add_relu_kernel

    def fork(self):
        return copy.copy(self)

    def follow(self, other):
        """[a transpose] that brings this branch to the layout `other` has reached, or []."""
        return self._into(other.layout, 'transpose')

    def _into(self, layout, name):
        if layout == self.layout:
            return []
        transpose = Transpose(self.layout, layout)
        self.layout = layout
        return [(name, transpose)]

    def conv(self, name, channels, kernel, stride=1, padding=0, groups=1, in_channels=0):
        layers = self._into(self.conv_layout, f'{name}_transpose')
        return layers + [(name, nn.Conv2D(channels, kernel, strides=stride, padding=padding, groups=groups,
                                          layout=self.conv_layout, use_bias=False, in_channels=in_channels,
                                          weight_initializer=HE_NORMAL))]

    def _batchnorm_options(self, channels, zero_gamma):
        return dict(axis=self.batchnorm_layout.index('C'), momentum=self.batchnorm_mom,
                    epsilon=self.batchnorm_eps, in_channels=channels,
                    gamma_initializer='zeros' if zero_gamma else 'ones')

    def batchnorm(self, name, channels, last_of_unit=False):
        """A batchnorm; `last_of_unit`: the last of a residual body, gamma 0 with `zero_gamma`."""
        layers = self._into(self.batchnorm_layout, f'{name}_transpose')
        block = nn.BatchNorm(**self._batchnorm_options(channels, last_of_unit and self.zero_gamma))
        return layers + [(name, without_weight_decay(block, 'gamma', 'beta'))]

    def batchnorm_relu(self, name, channels):
        layers = self._into(self.batchnorm_layout, f'{name}_transpose')
        block = BatchNormReLU(self.bn_relu_kernel, **self._batchnorm_options(channels, zero_gamma=False))
        return layers + [(name, without_weight_decay(block, 'gamma', 'beta'))]

    def batchnorm_add_relu(self, name, channels, drop_rate=0.0):
        """(transposes for the body, the block): the final batchnorm of a residual body (gamma 0 with
        `zero_gamma`), fused with the shortcut addition and the ReLU, and the body dropped per sample with
        `drop_rate` in training (BatchNormAddReLU). The shortcut must `follow` this builder."""
        layers = self._into(self.batchnorm_layout, f'{name}_transpose')
        block = BatchNormAddReLU(self.bn_add_relu_kernel, drop_rate,
                                 **self._batchnorm_options(channels, self.zero_gamma))
        return layers, without_weight_decay(block, 'gamma', 'beta')

    def max_pool(self, name):
        layers = self._into(self.pooling_layout, f'{name}_transpose')
        return layers + [(name, nn.MaxPool2D(pool_size=3, strides=2, padding=1, layout=self.pooling_layout))]

    def global_avg_pool(self, name):
        """Pools to (N, C): the flatten turns (N, 1, 1, C) and (N, C, 1, 1) alike into (N, C), so the classifier
        needs no transpose. It is explicit because oneDNN's INT8 fully-connected operator cannot flatten a
        4-d input that is in oneDNN's blocked layout ('We can't generate TBlob for MKLDNN data')."""
        layers = self._into(self.pooling_layout, f'{name}_transpose')
        return layers + [(name, nn.GlobalAvgPool2D(layout=self.pooling_layout)), (f'{name}_flatten', nn.Flatten())]

    def dense(self, units, in_units):
        """The classifier, on (N, in_units) features."""
        block = nn.Dense(units, in_units=in_units, weight_initializer=CLASSIFIER_INIT[self.init],
                         bias_initializer='zeros')
        return without_weight_decay(block, 'bias')
