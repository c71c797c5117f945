"""Exponential moving average of the weights (--model-ema, --model-ema-decay), as timm's ModelEmaV2.

    average = ema.WeightAverage(net, decay=0.9999, ctx=args.contexts[0])    # a float32 copy of every array
    average.update()                                      # after every optimizer step: a = d * a + (1 - d) * w
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

# Names under which the average goes into a .state file (checkpoint.save_state's `extra` arrays).
STATE_PREFIX = 'ema:'


class WeightAverage:
    """A float32 exponential moving average of every array of `net` on the device `ctx`."""

    def __init__(self, net, decay, ctx):
        self.decay = decay
        self.ctx = ctx
        self.params = net._collect_params_with_prefix()
        self.average = {name: param.data(ctx).astype('float32', copy=True) for name, param in self.params.items()}

    def update(self):
        """Move the average towards the current weights (call after every optimizer step)."""
        if self.ctx.device_type == 'cpu':
            # MXNet's oneDNN batchnorm writes the running statistics outside the engine's dependency
            # tracking (apache/mxnet#18610): without waiting, the average read them half-updated (seen as
            # a run and its resumed twin disagreeing). GPUs (cuDNN) are tracked and keep the pipeline.
            mx.nd.waitall()
        for name, param in self.params.items():
            average = self.average[name]
            average *= self.decay
            average += (1 - self.decay) * param.data(self.ctx).astype('float32', copy=False)   # no copy in float32

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
        STATE_PREFIX + 'rank<r>:' + name."""
        arrays = {STATE_PREFIX + name: value for name, value in self.average.items()}
        for rank, statistics in (worker_statistics or {}).items():
            arrays.update({f'{STATE_PREFIX}rank{rank}:{name}': mx.nd.array(value) for name, value in statistics.items()})
        return arrays

    def restore(self, arrays, rank=0):
        """Take the average back from a read .state (checkpoint.State.extra), with worker `rank`'s own
        batchnorm statistics when the state has them; False when it holds no average (a run that did not
        average, or other names), so the average starts from the current weights."""
        own = f'{STATE_PREFIX}rank{rank}:'
        saved = {name[len(STATE_PREFIX):]: value for name, value in arrays.items()
                 if name.startswith(STATE_PREFIX) and not name[len(STATE_PREFIX):].startswith('rank')}
        if set(saved) != set(self.average):
            return False
        saved.update({name[len(own):]: value for name, value in arrays.items() if name.startswith(own)})
        for name, value in saved.items():
            value = value if isinstance(value, mx.nd.NDArray) else mx.nd.array(value)
            self.average[name] = value.astype('float32').as_in_context(self.ctx)
        return True
