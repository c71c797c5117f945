"""Exponential moving average of the weights (--model-ema, --model-ema-decay, --model-ema-steps,
--model-ema-warmup), as timm's ModelEmaV3 and torchvision's ExponentialMovingAverage.

    average = ema.WeightAverage(net, decay=0.9999, ctx=world.devices.contexts[0], every=32)   # float32 copies
    average.update(step, steps_per_epoch)   # after optimizer step `step` (1, 2, ...): every 32nd,
                                            # a = d * a + (1 - d) * w
    with average.swapped_in():                            # the network computes with the average meanwhile
        metrics, _ = inference.validate(args, net, val_loader, world)
        checkpoint.save_params(net, path)                 # a .params file like any other (`--load` reads it)

Every array of the network is averaged, batchnorm running statistics included, in float32 whatever the
network's precision (a float16 network's weights are averaged as float32 values). With several devices in
one process the first device's arrays are averaged (the trained weights are the same on every device; each
device keeps its own batchnorm statistics). With several workers every worker keeps its own average (the
same weights, its own batchnorm statistics) and validates its part of the data with it.
"""
import contextlib

import mxnet as mx
import numpy as np

# Names under which the average goes into a .state file (checkpoint.save_state's `extra` arrays).
STATE_PREFIX = 'ema:'

# The name of the update count in a .state file: whether the average has moved yet survives a resume.
UPDATES_NAME = STATE_PREFIX + '#updates'

# Arrays per multi-tensor update call: MXNet's multi_sgd kernels take at most 60 (as its optimizers do).
ARRAYS_PER_CALL = 60


def warmed_up_decay(decay, step):
    """timm's --model-ema-warmup (ModelEmaV3, gamma 1, power 2/3): the decay at optimizer step `step` is
    1 - (1 + step)^(-2/3), capped at `decay`, so the first steps' weights (far from trained) fade quickly:
    0.37 at step 1, 0.99 at step 999, 0.999 at step 31,622."""
    return min(decay, 1 - (1 + step) ** (-2 / 3))


def copies_weights(step, every, steps_per_epoch, copy_epochs):
    """torchvision's warm-up of the average (references/classification/train.py: after each update made during
    the learning-rate warm-up epochs it sets the average's count to 0, and an update at count 0 copies): whether
    the update after optimizer step `step` copies the weights instead of averaging. It does when it is the first
    update, or when the one before it (after step `step - every`) came within the first `copy_epochs` epochs of
    `steps_per_epoch` optimizer steps. A function of the step, so a resume decides alike."""
    previous = step - every
    return previous < 1 or previous <= copy_epochs * steps_per_epoch


def average_step(decay, count):
    """The multi-tensor SGD arguments that make an update of `count` arrays a = d * a + (1 - d) * w."""
    return dict(num_weights=count, lrs=(1.0,) * count, wds=(1 - decay,) * count, rescale_grad=-(1 - decay))


class WeightAverage:
    """A float32 exponential moving average of every array of `net` on the device `ctx`, moved towards the
    weights every `every` optimizer steps with the per-step decay raised to that power (the same horizon as
    updating every step, for 1/every of the host work), or with `decay_per_update` as it is (torchvision's
    adjusted rule, training_extras.ema_decay); with `warmup`, timm's warm-up of the decay; with `copy_epochs`,
    torchvision's copy of the weights during the learning-rate warm-up (copies_weights). `updates` counts the
    updates over the run (kept in the state): an average with none is still the weights it started from.
    `on_first_step(step, steps_per_epoch)` is called at the first update() call, when the length of an epoch
    is first known (training_extras checks there that the run is long enough for `every`)."""

    def __init__(self, net, decay, ctx, every=1, warmup=False, decay_per_update=None, copy_epochs=None,
                 on_first_step=None):
        self.decay, self.every, self.warmup, self.decay_per_update = decay, every, warmup, decay_per_update
        self.copy_epochs = copy_epochs
        self.on_first_step = on_first_step
        self.updates = 0          # over the run, resumes included
        self.last_step = 0        # the optimizer step of the latest update() call
        self.ctx = ctx
        self.params = net._collect_params_with_prefix()
        self.average = {name: param.data(ctx).astype('float32', copy=True) for name, param in self.params.items()}
        # float16 weights need the mixed-precision kernel, which also writes a float16 copy of the average:
        # scratch arrays for it, so that the network's own weights are never written.
        self.scratch = {name: mx.nd.zeros(param.shape, ctx=ctx, dtype=param.dtype)
                        for name, param in self.params.items() if np.dtype(param.dtype) != np.float32}

    def update_decay(self, step):
        """The decay of the update after optimizer step `step`."""
        if self.decay_per_update is not None:
            return self.decay_per_update
        decay = warmed_up_decay(self.decay, step) if self.warmup else self.decay
        return decay ** self.every

    def update(self, step, steps_per_epoch=None):
        """After optimizer step `step` (1, 2, ... over the run, of `steps_per_epoch` an epoch): every `every`
        steps, a = d * a + (1 - d) * w for every array, in MXNet's multi-tensor SGD kernels (an SGD step of `a`
        with learning rate 1, weight decay 1 - d and the gradient -(1 - d) * w is exactly that): a few operators
        for all 267 arrays of ResNet-50 instead of three per array; or a = w where copies_weights says so."""
        if self.on_first_step is not None:
            self.on_first_step(step, steps_per_epoch)
            self.on_first_step = None
        self.last_step = step
        if step % self.every:
            return
        if self.ctx.device_type == 'cpu':
            # MXNet's oneDNN batchnorm writes the running statistics outside the engine's dependency
            # tracking (apache/mxnet#18610): without waiting, the average read them half-updated (seen as
            # a run and its resumed twin disagreeing). GPUs (cuDNN) are tracked and keep the pipeline.
            mx.nd.waitall()
        if self.copy_epochs is not None and copies_weights(step, self.every, steps_per_epoch, self.copy_epochs):
            self.copy()
        else:
            self.blend(self.update_decay(step))
        self.updates += 1

    def copy(self):
        """a = w for every array (as float32), exactly."""
        for name, param in self.params.items():
            mx.nd.Cast(param.data(self.ctx), dtype='float32', out=self.average[name])

    def blend(self, decay):
        """a = decay * a + (1 - decay) * w for every array, queued on MXNet's engine."""
        names = list(self.params)
        for first in range(0, len(names), ARRAYS_PER_CALL):
            chunk = names[first:first + ARRAYS_PER_CALL]
            single = [n for n in chunk if n not in self.scratch]
            mixed = [n for n in chunk if n in self.scratch]
            if single:
                inputs = [array for n in single for array in (self.average[n], self.params[n].data(self.ctx))]
                mx.nd.multi_sgd_update(*inputs, out=[self.average[n] for n in single],
                                       **average_step(decay, len(single)))
            if mixed:   # the float32 average is the kernel's master weight, updated in place
                inputs = [array for n in mixed for array in
                          (self.scratch[n], self.params[n].data(self.ctx), self.average[n])]
                mx.nd.multi_mp_sgd_update(*inputs, out=[self.scratch[n] for n in mixed],
                                          **average_step(decay, len(mixed)))

    @contextlib.contextmanager
    def swapped_in(self):
        """The network holds the average (in its own dtypes, on all its devices) inside the block; its own
        arrays, per device, come back afterwards, also on an exception."""
        saved = {name: [data.copy() for data in param.list_data()] for name, param in self.params.items()}
        try:
            for name, param in self.params.items():
                param.set_data(self.average[name].astype(param.dtype))
            yield
        finally:
            for name, param in self.params.items():
                for data, kept in zip(param.list_data(), saved[name]):
                    kept.copyto(data)

    def state_arrays(self, worker_statistics=None):
        """The average as {STATE_PREFIX + name: array} for the .state file, with `worker_statistics` ({rank:
        {name: array}} of every worker's averaged batchnorm statistics, several workers) as
        STATE_PREFIX + 'rank<r>:' + name, and the update count as UPDATES_NAME."""
        arrays = {STATE_PREFIX + name: value for name, value in self.average.items()}
        arrays[UPDATES_NAME] = mx.nd.array([self.updates], dtype='float64')
        for rank, statistics in (worker_statistics or {}).items():
            arrays.update({f'{STATE_PREFIX}rank{rank}:{name}': mx.nd.array(value) for name, value in statistics.items()})
        return arrays

    def restore(self, arrays, rank=0):
        """Take the average back from a read .state (checkpoint.State.extra), with worker `rank`'s own
        batchnorm statistics when the state has them; False when it holds no average (a run that did not
        average, or other names), so the average starts from the current weights. A state written before the
        update count was kept is taken as updated (its count is unknown)."""
        own = f'{STATE_PREFIX}rank{rank}:'
        saved = {name[len(STATE_PREFIX):]: value for name, value in arrays.items() if name != UPDATES_NAME and
                 name.startswith(STATE_PREFIX) and not name[len(STATE_PREFIX):].startswith('rank')}
        if set(saved) != set(self.average):
            return False
        count = arrays.get(UPDATES_NAME)
        if isinstance(count, mx.nd.NDArray):
            count = count.asnumpy()
        self.updates = 1 if count is None else int(np.asarray(count).ravel()[0])
        saved.update({name[len(own):]: value for name, value in arrays.items() if name.startswith(own)})
        for name, value in saved.items():
            value = value if isinstance(value, mx.nd.NDArray) else mx.nd.array(value)
            self.average[name] = value.astype('float32').as_in_context(self.ctx)
        return True
