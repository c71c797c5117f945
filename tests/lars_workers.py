"""--optimizer lars on 2 Horovod workers, run by tests/test_lars.py:

    horovodrun -np 2 --gloo python tests/lars_workers.py OUT.json

For float32 and then the float16 twin, each worker takes one LARS step of the recipe's TrainingStep on its own
batch (the workers' batches differ), from weights broadcast from rank 0. Rank 0 writes, per dtype and per
worker, every parameter before the step, its gradient as the optimizer saw it (after the all-reduce, times
rescale_grad) and after the step, so the test can check the trust ratio was taken of the all-reduced gradient.
"""
import json
import os
import sys

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rn50.training import losses  # noqa: E402
from float16_twin import Float16Net, batch_of, step_for  # noqa: E402

ETA, EPS, WD, LR, MOMENTUM = 0.02, 1e-6, 0.01, 0.5, 0.9
FLAGS = ['--optimizer', 'lars', '--lars-eta', str(ETA), '--lars-eps', str(EPS), '--wd', str(WD),
         '--mom', str(MOMENTUM), '--label-smoothing', '0']


def one_step(dtype):
    """{parameter name: {'shape', 'before', 'grad', 'after': rows, one per worker}} after one step."""
    mx.random.seed(int(os.environ.get('HOROVOD_RANK', '0')))   # other weights per worker until the broadcast
    step = step_for(Float16Net(), dtype, kv_store='horovod', extra=FLAGS)
    world = step.world
    world.comm.broadcast_parameters(step.net.collect_params())
    if step.loss_scale is not None:   # float16: a scale whose gradients fit this tiny net
        step.loss_scale = losses.DynamicLossScale(scale=8.0)
    params = {name: p for name, p in step.net._collect_params_with_prefix().items() if p.grad_req != 'null'}
    before = {name: p.data().asnumpy().astype(np.float32) for name, p in params.items()}
    rng = np.random.default_rng(10 + world.rank)
    step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), dtype), 0, 0, LR)
    optimizer = step.gluon_trainer._optimizer
    assert type(optimizer).__name__ == 'MLPerfLARS' and optimizer.momentum == MOMENTUM
    result = {}
    for name, param in params.items():
        grad = param.grad().asnumpy().astype(np.float32) * np.float32(optimizer.rescale_grad)
        after = param.data().asnumpy().astype(np.float32)
        rows = world.comm.gather(np.concatenate([before[name].ravel(), grad.ravel(), after.ravel()]))
        size = before[name].size
        result[name] = {'shape': list(before[name].shape), 'before': rows[:, :size].tolist(),
                        'grad': rows[:, size:2 * size].tolist(), 'after': rows[:, 2 * size:].tolist()}
    return world.rank, result


def main(output):
    results = {}
    for dtype in ('float32', 'float16'):
        rank, results[dtype] = one_step(dtype)
    if rank == 0:
        with open(output, 'w') as f:
            json.dump(results, f)


if __name__ == '__main__':
    main(sys.argv[1])
