"""LARS as MLPerf's ResNet-50 runs it (`--optimizer lars`): layer-wise adaptive rate scaling for large batches.

    ./runner -n 8 -b 400 --optimizer lars --lars-eta 0.001 --lr-schedule poly ...

For each convolution and dense weight (an array of 2 or more dimensions) the step's learning rate is scaled
by the trust ratio eta x ||w|| / (||g|| + wd x ||w|| + eps) (1 where either norm is 0), then applied with
weight decay and momentum: m = momentum x m - lr x trust x (g + wd x w), w = w + m. Batchnorm gamma and beta
and biases (1-dimensional) take plain SGD with momentum and no weight decay: m = momentum x m - lr x g.

MXNet 1.9.1's own `lars` optimizer decides which parameters to leave out by their names in
`optimizer.idx2name`, which gluon.Trainer never fills: under Gluon every parameter got the trust ratio and the
weight decay. This one decides by shape, which Gluon always gives. With float16 weights it keeps float32
master weights (`multi_precision`), as MXNet's SGD does.
"""
import mxnet as mx
import numpy as np

from rn50 import flags


def add_args(group):
    """The flags, in fit.py's Training group."""
    group.add_argument('--lars-eta', type=flags.real(minimum=0, exclusive=True), default=0.001,
                       help='--optimizer lars: the trust coefficient eta')
    group.add_argument('--lars-eps', type=flags.real(minimum=0), default=0.0,
                       help='--optimizer lars: added to the denominator of the trust ratio')


# Arrays per call of MXNet's multi-tensor kernels: its preloaded_multi_sgd kernels take at most 60.
ARRAYS_PER_CALL = 60


def sums_of_squares(arrays):
    """The sum of the squares of each of `arrays` (NDArrays of one dtype on one device), a float32 vector, in
    MXNet's multi-tensor kernel. Its CPU kernel squares float16 values in float16 (a loss-scaled gradient above
    256 would square to inf), so on a CPU float16 arrays are cast first; the GPU kernel squares in float32."""
    if arrays[0].context.device_type == 'cpu' and arrays[0].dtype == np.float16:
        arrays = [a.astype('float32') for a in arrays]
    parts = [mx.nd.multi_sum_sq(*arrays[i:i + ARRAYS_PER_CALL], num_arrays=len(arrays[i:i + ARRAYS_PER_CALL]))
             for i in range(0, len(arrays), ARRAYS_PER_CALL)]
    return parts[0] if len(parts) == 1 else mx.nd.concat(*parts, dim=0)


class MLPerfLARS(mx.optimizer.Optimizer):
    """The optimizer of --optimizer lars (factory.py maps the name to this class; not in MXNet's registry).

    Gluon's Updater hands it up to ARRAYS_PER_CALL arrays of one dtype at a time (`aggregate_num`), and each
    call is a few of MXNet's multi-tensor kernels, as MXNet's own LARS and NVIDIA's MLPerf code do: the sums
    of squares of the weights and of the gradients (multi_sum_sq), the layer-wise rates (multi_lars), the SGD
    step with momentum (preloaded_multi_sgd_mom_update, or its float32-master variant). One array at a time,
    the same formula took about ten operators per array: half the images/s of a small network on 2 cores.
    The momentum is kept as MXNet's SGD keeps it (m = momentum x m - lr x step; w += m)."""

    def __init__(self, momentum=0.9, eta=0.001, eps=0.0, **kwargs):
        super().__init__(**kwargs)
        self.momentum, self.eta, self.eps = momentum, eta, eps
        self.aggregate_num = ARRAYS_PER_CALL
        # The first version kept the momentum with the other sign; its pickled optimizers lack this attribute
        # (see upgrade_loaded_state).
        self.momentum_sign = 'mxnet'
        self.device_rates = {}   # (device, indices) -> (rate multipliers, on the device, weight decays, on the device)

    def create_state(self, index, weight):
        """(momentum, float32 master weight or None); the Updater calls the _multi_precision variant when
        multi_precision is set."""
        momentum = mx.nd.zeros(weight.shape, weight.context, dtype='float32')
        if self.multi_precision and weight.dtype == np.float16:
            return momentum, weight.astype('float32')
        return momentum, None

    create_state_multi_precision = create_state

    def _rate_multipliers(self, indices):
        """Each array's lr_mult, found as MXNet's _get_lrs finds it (the rate it gives is the step's times this)."""
        multipliers = []
        for index in indices:
            if index in self.param_dict:
                multipliers.append(self.param_dict[index].lr_mult)
            elif index in self.lr_mult:
                multipliers.append(self.lr_mult[index])
            else:
                multipliers.append(self.lr_mult.get(self.idx2name.get(index), 1.0))
        return multipliers

    def _device_rates(self, indices, order, layered, ctx):
        """(learning rates, weight decays) of the arrays `indices` in `order`, float32 vectors on `ctx`, without a
        blocking host-to-device copy per step: the arrays' rate multipliers (lr_mult) and weight decays are
        copied to the device once, again only when they change (a resume with another --wd), and each step's
        rate multiplies the multipliers there (an asynchronous operator taking the rate as a parameter). The
        multipliers are compared as they are (a rate divided by the step's is not the multiplier to the bit)."""
        multipliers = tuple(self._rate_multipliers(indices)[i] for i in order)
        wds = self._get_wds(indices)
        decays = tuple(wds[i] if k < layered else 0.0 for k, i in enumerate(order))
        key = (ctx, tuple(indices[i] for i in order))
        cached = self.device_rates.get(key)
        if cached is None or cached[0] != multipliers or cached[2] != decays:
            cached = self.device_rates[key] = (multipliers, mx.nd.array(multipliers, ctx=ctx), decays,
                                               mx.nd.array(decays, ctx=ctx))
        return cached[1] * self.learning_rate, cached[3]

    def __getstate__(self):
        state = super().__getstate__()
        state['device_rates'] = {}    # device arrays, made again after a resume
        return state

    def update(self, index, weight, grad, state):
        self.update_multi_precision(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        """One step of the arrays `index` (a list, or one index), all of one dtype as the Updater groups them."""
        indices, weights, grads, states = (index, weight, grad, state) if isinstance(index, (tuple, list)) else \
            ([index], [weight], [grad], [state])
        self._update_count(indices)
        # Convolution and dense weights first (trust ratio, weight decay), then the rest (plain, no decay).
        order = sorted(range(len(indices)), key=lambda i: weights[i].ndim <= 1)
        layered = sum(weights[i].ndim > 1 for i in order)
        lrs, wds = self._device_rates(indices, order, layered, weights[0].context)
        weights, grads = [weights[i] for i in order], [grads[i] for i in order]
        momenta, masters = [states[i][0] for i in order], [states[i][1] for i in order]
        targets = [master if master is not None else weight for weight, master in zip(weights, masters)]
        if layered:
            mx.nd.multi_lars(lrs[:layered], sums_of_squares(targets[:layered]), sums_of_squares(grads[:layered]),
                             wds[:layered], eta=self.eta, eps=self.eps, rescale_grad=self.rescale_grad,
                             out=lrs[:layered])
        options = dict(num_weights=len(weights), momentum=self.momentum, rescale_grad=self.rescale_grad)
        if self.clip_gradient is not None:   # as MXNet's LARS: the trust ratio sees the unclipped gradient
            options['clip_gradient'] = self.clip_gradient
        if masters[0] is not None:
            inputs = [a for group in zip(weights, grads, momenta, masters) for a in group]
            mx.nd.preloaded_multi_mp_sgd_mom_update(*inputs, lrs, wds, out=weights, **options)
        else:
            inputs = [a for group in zip(weights, grads, momenta) for a in group]
            mx.nd.preloaded_multi_sgd_mom_update(*inputs, lrs, wds, out=weights, **options)


def upgrade_loaded_state(optimizer, updaters):
    """After Trainer.load_states: a LARS state written by the first version of this optimizer (which kept the
    momentum's negation) gets MXNet's sign, so that its resume continues the same run."""
    if isinstance(optimizer, MLPerfLARS):
        vars(optimizer).setdefault('device_rates', {})   # a state written before the rates were kept on the device
    if isinstance(optimizer, MLPerfLARS) and 'momentum_sign' not in vars(optimizer):
        for updater in updaters:
            for momentum, _ in updater.states.values():
                momentum *= -1
        optimizer.momentum_sign = 'mxnet'
