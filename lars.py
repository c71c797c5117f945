"""LARS as MLPerf's ResNet-50 runs it (`--optimizer lars`): layer-wise adaptive rate scaling for large batches.

    ./runner -n 8 -b 400 --optimizer lars --lars-eta 0.001 --lr-schedule poly ...

For each convolution and dense weight (an array of 2 or more dimensions) the step's learning rate is scaled
by the trust ratio eta x ||w|| / (||g|| + wd x ||w|| + eps) (1 where either norm is 0), then applied with
weight decay and momentum: v = momentum x v + lr x trust x (g + wd x w), w = w - v. Batchnorm gamma and beta
and biases (1-dimensional) take plain SGD with momentum and no weight decay: v = momentum x v + lr x g.

MXNet 1.9.1's own `lars` optimizer decides which parameters to leave out by their names in
`optimizer.idx2name`, which gluon.Trainer never fills: under Gluon every parameter got the trust ratio and the
weight decay. This one decides by shape, which Gluon always gives. With float16 weights it keeps float32
master weights (`multi_precision`), as MXNet's SGD does.
"""
import mxnet as mx
import numpy as np

import flags


def add_args(group):
    """The flags, in fit.py's Training group."""
    group.add_argument('--lars-eta', type=flags.real(minimum=0, exclusive=True), default=0.001,
                       help='--optimizer lars: the trust coefficient eta')
    group.add_argument('--lars-eps', type=flags.real(minimum=0), default=0.0,
                       help='--optimizer lars: added to the denominator of the trust ratio')


@mx.optimizer.register
class MLPerfLARS(mx.optimizer.Optimizer):
    """The optimizer of --optimizer lars (registered as `mlperflars`; step.py creates it by that name)."""

    def __init__(self, momentum=0.9, eta=0.001, eps=0.0, **kwargs):
        super().__init__(**kwargs)
        self.momentum, self.eta, self.eps = momentum, eta, eps

    def create_state(self, index, weight):
        """(momentum, float32 master weight or None); the Updater calls the _multi_precision variant when
        multi_precision is set."""
        momentum = mx.nd.zeros(weight.shape, weight.context, dtype='float32')
        if self.multi_precision and weight.dtype == np.float16:
            return momentum, weight.astype('float32')
        return momentum, None

    create_state_multi_precision = create_state

    def trust_ratio(self, weight, grad, wd):
        """eta x ||w|| / (||g|| + wd x ||w|| + eps) as a 1-element array on the device (no host wait), 1
        where a norm is 0 (a zero-initialised array)."""
        weight_norm, grad_norm = weight.norm(), grad.norm()
        ratio = self.eta * weight_norm / (grad_norm + wd * weight_norm + self.eps + (weight_norm == 0))
        return mx.nd.where((weight_norm > 0) * (grad_norm > 0), ratio, mx.nd.ones_like(ratio))

    def update(self, index, weight, grad, state):
        self.update_multi_precision(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._update_count(index)
        momentum, master = state
        target = master if master is not None else weight
        grad = grad.astype('float32') * self.rescale_grad
        if self.clip_gradient is not None:
            grad = mx.nd.clip(grad, -self.clip_gradient, self.clip_gradient)
        lr = self._get_lr(index)
        if weight.ndim > 1:   # convolution and dense weights: trust ratio and weight decay
            wd = self._get_wd(index)
            momentum[:] = self.momentum * momentum + mx.nd.broadcast_mul(
                lr * self.trust_ratio(target, grad, wd), grad + wd * target)
        else:                 # batchnorm gamma/beta, biases: plain SGD with momentum, no weight decay
            momentum[:] = self.momentum * momentum + lr * grad
        target[:] = target - momentum
        if master is not None:
            weight[:] = master.astype(weight.dtype)
