"""LAMB as timm trains ResNet-50 with it (`--optimizer lamb`, the optimizer of `--recipe rsb-a3`).

    ./runner -n 8 --recipe rsb-a3                 # LAMB, weight decay 0.02, ...
    ./runner -n 8 -b 256 -l 0.001 --optimizer lamb --wd 0.02 ...

Per array, with the step's gradient g (the all-reduced mean, divided by c below), t the step and
beta1 0.9, beta2 0.999, eps 1e-6: m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2,
u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + wd x w, and w = w - lr x r x u, where the trust
ratio r = ||w|| / ||u|| (1 where either norm is 0) for arrays with weight decay and r = 1 for those without
(batchnorm gamma/beta and biases, whose wd_mult is 0 in this recipe's networks). Before that, every gradient
is divided by c = max(1, ||all gradients|| / MAX_GRAD_NORM): timm's Lamb clips the global norm to 1.0 by
default.

MXNet 1.9.1's own `lamb` takes the trust ratio of every array and clips nothing: the two differences from
timm this module removes. It keeps MXNet's multi-tensor kernels (multi_lamb_update, and multi_mp_lamb_update
for float16 weights with float32 master copies): the arrays without the trust ratio go through the same
kernel with the ratio's bounds at 0, where MXNet's kernel takes a ratio of 1. The global norm needs every
gradient of the step, which one call of the optimizer does not see (Gluon's Updater hands it up to 45 arrays
at a time): the training step calls `measure_gradients` once, after the all-reduce, and the update divides
the gradients by c on the device, into scratch arrays (MXNet's multi-tensor SGD kernel as a scaler, one call
per 45 arrays, exact where c is 1), since MXNet's LAMB kernels take their gradient scale as a host number: the
host reads nothing (reading the norm was one more wait for the device per step, the second of a float16 step).

A state saved by MXNet's own LAMB (this recipe before) holds that optimizer and resumes with it unchanged.
"""
import mxnet as mx
from mxnet.ndarray.contrib import multi_lamb_update, multi_mp_lamb_update

from rn50.optim import lars

# timm's Lamb default: the global gradient norm is clipped to this.
MAX_GRAD_NORM = 1.0

# Arrays per call of MXNet's multi_lamb_update (at most 45).
ARRAYS_PER_CALL = 45


class TimmLAMB(mx.optimizer.LAMB):
    """The optimizer of --optimizer lamb (factory.py maps the name to this class; not in MXNet's registry)."""

    def __init__(self, max_grad_norm=MAX_GRAD_NORM, **kwargs):
        super().__init__(**kwargs)
        self.max_grad_norm = max_grad_norm
        self.aggregate_num = ARRAYS_PER_CALL
        self.gradient_norm = None   # the step's global gradient norm before rescale_grad (set by measure_gradients)
        self.clip_divisor = None    # c of the docstring for the step being applied, a device array (None: 1)
        self.clip_scales = {}       # 1 / c of that step on each device, {context: array}
        self.scaled_grads = {}      # the gradients divided by c, {(index, context): array}, reused every step

    def measure_gradients(self, params, ctx):
        """Queue the global norm of the step's gradients (those of `params`, a ParameterDict, on `ctx`, after the
        all-reduce); the next update divides the gradients by max(1, norm x rescale_grad / max_grad_norm)."""
        by_dtype = {}
        for param in params.values():
            if param.grad_req != 'null':
                by_dtype.setdefault(param.dtype, []).append(param.grad(ctx))
        squares = [lars.sums_of_squares(grads).sum() for grads in by_dtype.values()]
        self.gradient_norm = mx.nd.add_n(*squares).sqrt()

    def __getstate__(self):
        state = super().__getstate__()
        # Device arrays of one step, not part of a saved state
        state.update(gradient_norm=None, clip_divisor=None, clip_scales={}, scaled_grads={})
        return state

    def clip_scale(self, ctx):
        """1 / c of the step on `ctx` (a device array of one value), or None where nothing was measured; c is
        computed on the device at the step's first update call, where rescale_grad is the step's."""
        if self.gradient_norm is not None:
            self.clip_divisor = mx.nd.maximum(self.gradient_norm * (self.rescale_grad / self.max_grad_norm), 1.0) \
                if self.max_grad_norm else None
            self.gradient_norm, self.clip_scales = None, {}
        if self.clip_divisor is None:
            return None
        if ctx not in self.clip_scales:
            self.clip_scales[ctx] = (1 / self.clip_divisor).as_in_context(ctx)
        return self.clip_scales[ctx]

    def clipped(self, indices, grads):
        """The gradients of `indices` divided by the step's c, in scratch arrays of their own (the gradients stay
        as they are), on the device: MXNet's multi-tensor SGD kernel, which takes its rates as device arrays, as a
        scaler (one rounding of g / c in the gradients' dtype; exactly g where c is 1), two calls for them all (at
        most 45)."""
        scale = self.clip_scale(grads[0].context)
        if scale is None:
            return grads
        ctx = grads[0].context
        out = []
        for i, grad in zip(indices, grads):
            key = (i, ctx)
            if key not in self.scaled_grads or self.scaled_grads[key].shape != grad.shape:
                self.scaled_grads[key] = mx.nd.zeros(grad.shape, ctx, dtype=grad.dtype)
            out.append(self.scaled_grads[key])
        count = len(grads)
        # weight w = 0 (reset), rate 1/c, no weight decay, gradient scale -1: (1 - 0) w + (1/c) g = g / c
        mx.nd.reset_arrays(*out, num_arrays=count)
        mx.nd.preloaded_multi_sgd_update(*[a for pair in zip(out, grads) for a in pair], scale.broadcast_to((count,)),
                                         mx.nd.zeros((count,), ctx), rescale_grad=-1.0, num_weights=count, out=out)
        return out

    def _update_impl(self, index, weight, grad, state, multi_precision=False):
        """One step of the arrays `index` (a list, or one index), all of one dtype as the Updater groups them;
        MXNet's LAMB.update and update_multi_precision call it."""
        indices, weights, grads, states = (index, weight, grad, state) if isinstance(index, (tuple, list)) else \
            ([index], [weight], [grad], [state])
        grads = self.clipped(indices, grads)
        for i in indices:
            self._update_count(i)
        steps = [self._index_update_count[i] for i in indices]
        lrs, wds = [self._get_lr(i) for i in indices], [self._get_wd(i) for i in indices]
        options = dict(beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
                       bias_correction=self.bias_correction, rescale_grad=self.rescale_grad)
        if self.clip_gradient:
            options['clip_gradient'] = self.clip_gradient
        adapted = [k for k in range(len(indices)) if wds[k] != 0]
        plain = [k for k in range(len(indices)) if wds[k] == 0]
        bounds = {}
        if self.lower_bound:
            bounds['lower_bound'] = self.lower_bound
        if self.upper_bound:
            bounds['upper_bound'] = self.upper_bound
        # Bounds of 0 clip ||w|| to 0, and MXNet's kernel takes a ratio of 1 where a norm is 0.
        for group, group_bounds in ((adapted, bounds), (plain, dict(lower_bound=0.0, upper_bound=0.0))):
            for start in range(0, len(group), self.aggregate_num):
                chunk = group[start:start + self.aggregate_num]
                arrays = dict(weights=[weights[k] for k in chunk], grads=[grads[k] for k in chunk],
                              step_count=[steps[k] for k in chunk], lrs=[lrs[k] for k in chunk],
                              wds=[wds[k] for k in chunk], out=[weights[k] for k in chunk])
                if multi_precision:   # the Updater's state: (float32 master weight, (mean, var))
                    multi_mp_lamb_update(mean=[states[k][1][0] for k in chunk], var=[states[k][1][1] for k in chunk],
                                         weights32=[states[k][0] for k in chunk], **arrays, **options,
                                         **group_bounds)
                else:
                    multi_lamb_update(mean=[states[k][0] for k in chunk], var=[states[k][1] for k in chunk],
                                      **arrays, **options, **group_bounds)
