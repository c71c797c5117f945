#!/usr/bin/env python3
"""The recipe's training throughput against a bare hybridized Gluon loop on the same network and against
PyTorch, in one run.

    python scripts/benchmark_training.py [--batch-size 32] [--iters 12] [--image-size 224] [--rounds 2] [--amp]
    python scripts/benchmark_training.py --pieces      # the recipe's step with --drop-path and with --teacher
    python scripts/benchmark_training.py --environment --image-size 32 --iters 60 --rounds 3   # engine variables
    python scripts/benchmark_training.py --overflow-check --iters 8 --rounds 2   # float16's two orders, CPU twin

Both train ResNet-50 v1.5 (float32, or AMP with --amp) on synthetic data on this machine with the same math
(sparse labels, SGD with momentum 0.875 and weight decay 1/32768 on the weights): the recipe through
`train.py --data-backend synthetic --mode train --label-smoothing 0 --benchmark-iters N` (its epoch
`train.ips`, warm-up iterations left out), the bare loop as forward, backward and SGD step with one host
sync per iteration, timed after the same warm-up. The two alternate for --rounds rounds and the best of each
counts (a shared 2-core machine varies by about 10% from one minute to the next). With
PyTorch in .venv-consumers (`make consumers`; `make test` makes it too), PyTorch's torchvision ResNet-50 takes
its turn too (scripts/pytorch_peer.py: channels_last, bfloat16 autocast with --amp, the same math), in a
process of its own. Prints each one's images/s, the ratios (the recipe is held to >= 0.97 of the bare loop,
and to PyTorch's speed), every round, and the peak resident memory of the recipe and the bare loop. --pieces instead measures
the recipe alone, without and with the training-step pieces of issue 31 (stochastic depth 0.05, distillation
from a ResNet-50 teacher), alternating, the best of --rounds each. --environment measures the recipe alone with
none of the engine variables the runner gives GPU runs (ENGINE_VARIABLES), each alone, and all of them, in
turns, the best of --rounds each: which ones a CPU run should get (the runner sets only those).
--overflow-check measures the float16 step's two orders (train.py --overflow-check) on the CPU twin: the
recipe's TrainingStep in float16 with loss scaling over ResNet-50's parameters (float16 weights, float32 master
weights and momenta; MXNet's CPU has no float16 convolution, so the network only averages them), the update
queued before the host reads the overflow flag (after-update: UpdateUndo's copies, the GPU default) and after
(before-update), in turns, the best of --rounds each, in milliseconds per step; and the host's time to queue
the update and the copies (the time a GPU idles in the before-update order while the host queues the update).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import bootstrap
bootstrap.start(prepare_cpu=True)   # the repository importable, .venv, this CPU prepared for MXNet

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import models  # noqa: E402
from rn50.launch import interpreter  # noqa: E402
from rn50.reports import logs  # noqa: E402
from rn50.world import cpu  # noqa: E402

ROOT = bootstrap.ROOT
# The flags of /proc/cpuinfo that decide oneDNN's kernels (cpu.ISAS), printed with the figures.
DISPATCH_FLAGS = set().union(*(needs for _, _, needs, _ in cpu.ISAS))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--iters', type=int, default=12, help='iterations per measurement (the first is warm-up)')
    parser.add_argument('--image-size', type=int, default=224)
    parser.add_argument('--num-classes', type=int, default=1000, help='the classifier\'s width (the demo: 10)')
    parser.add_argument('--rounds', type=int, default=2, help='alternating measurements of each; the best counts')
    parser.add_argument('--amp', action='store_true', help='bfloat16 AMP on CPU, float16 on GPU')
    parser.add_argument('--pieces', action='store_true', help='the recipe without and with --drop-path, --teacher')
    parser.add_argument('--environment', action='store_true', help='the recipe without and with each engine variable')
    parser.add_argument('--overflow-check', action='store_true', help='the float16 step\'s two orders (CPU twin)')
    return parser.parse_args()


# The engine variables the runner gives GPU runs that a CPU run might take (--environment measures them there).
ENGINE_VARIABLES = {'MXNET_OPTIMIZER_AGGREGATION_SIZE': '60', 'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD': '999',
                    'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD': '25', 'MXNET_UPDATE_ON_KVSTORE': '0',
                    'MXNET_EXEC_ENABLE_ADDTO': '1'}


def recipe_ips(args, extra=(), environment=None):
    """(train.ips, peak MB) of train.py's synthetic step; `environment`: variables added to this process's."""
    with tempfile.TemporaryDirectory() as workspace:
        command = [sys.executable, os.path.join(ROOT, 'train.py'), '--data-backend', 'synthetic', '--mode', 'train',
                   '--batch-size', str(args.batch_size), '--benchmark-iters', str(args.iters), '--num-epochs', '1',
                   '--image-shape', f'3,{args.image_size},{args.image_size}', '--workspace', workspace,
                   '--num-classes', str(args.num_classes),
                   '--dtype', 'float32', '--seed', '1', '--label-smoothing', '0'] + (['--amp'] if args.amp else []) + \
            list(extra)
        env = {name: value for name, value in os.environ.items() if name not in ENGINE_VARIABLES}
        subprocess.run(command, check=True, capture_output=True, env=dict(env, **(environment or {})))
        epoch = [r for r in logs.read_dllogger(os.path.join(workspace, 'dllogger_log.log')) if r['step'] == [0]]
        with open(os.path.join(workspace, 'report.json')) as f:
            peak_memory_mb = json.load(f)['peak_memory_mb']
        return epoch[0]['data']['train.ips'], peak_memory_mb


def bare_ips(args):
    if args.amp:
        from mxnet.contrib import amp
        amp.init(target_dtype='bfloat16' if mx.context.num_gpus() == 0 else 'float16')
    net = models.get_model(num_classes=args.num_classes)
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01, 'momentum': 0.875,
                                                               'wd': 1 / 32768})
    images = mx.nd.random.uniform(-1, 1, (args.batch_size, 3, args.image_size, args.image_size))
    labels = mx.nd.array([i % args.num_classes for i in range(args.batch_size)])
    durations = []
    for _ in range(args.iters):
        start = time.time()
        with autograd.record():
            loss = loss_fn(net(images), labels)
        loss.backward()
        trainer.step(args.batch_size)
        loss.mean().asscalar()
        durations.append(time.time() - start)
    steady = logs.steady_durations(durations)
    return args.batch_size / (sum(steady) / len(steady))


def pytorch_run(args):
    """PyTorch's images/s (its iterations after the warm-up the recipe leaves out) and version, from
    scripts/pytorch_peer.py in a process of its own."""
    command = [sys.executable, os.path.join(ROOT, 'scripts', 'pytorch_peer.py'), '--batch-size', str(args.batch_size),
               '--iters', str(args.iters), '--image-size', str(args.image_size)] + (['--amp'] if args.amp else [])
    result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    steady = logs.steady_durations(result['seconds'])
    return round(args.batch_size / (sum(steady) / len(steady)), 2), result['torch']


def pieces(args):
    """The recipe's train.ips without and with each training-step piece, alternating rounds, the best of each."""
    with tempfile.TemporaryDirectory() as folder:
        teacher = os.path.join(folder, 'resnet50.params')
        net = models.get_model()
        net.initialize()
        net.save_parameters(teacher)
        variants = {'plain': [], 'drop path 0.05': ['--drop-path', '0.05'],
                    'teacher ResNet-50': ['--teacher', teacher, '--kd-alpha', '0.5', '--kd-temperature', '4']}
        rates = {name: [] for name in variants}
        for round_index in range(args.rounds):
            for name in (list(variants) if round_index % 2 == 0 else list(variants)[::-1]):
                rates[name].append(round(recipe_ips(args, variants[name])[0], 2))
    best = {name: max(values) for name, values in rates.items()}
    print(json.dumps({'batch_size': args.batch_size, 'image_size': args.image_size,
                      'cpu': cpu.identity(), 'onednn': cpu.describe(), 'train_ips': best,
                      'relative': {name: round(ips / best['plain'], 3) for name, ips in best.items()}, 'rounds': rates}))


def environment(args):
    """The recipe's train.ips with no engine variable, each of ENGINE_VARIABLES alone, and all of them, in turns
    (the order reversed every other round), the best of --rounds each."""
    variants = {'none': {}, **{name: {name: value} for name, value in ENGINE_VARIABLES.items()},
                'all': dict(ENGINE_VARIABLES)}
    rates = {name: [] for name in variants}
    for round_index in range(args.rounds):
        for name in (list(variants) if round_index % 2 == 0 else list(variants)[::-1]):
            rates[name].append(round(recipe_ips(args, environment=variants[name])[0], 2))
    best = {name: max(values) for name, values in rates.items()}
    print(json.dumps({'batch_size': args.batch_size, 'image_size': args.image_size, 'cpu': cpu.identity(),
                      'onednn': cpu.describe(), 'train_ips': best,
                      'relative': {name: round(ips / best['none'], 3) for name, ips in best.items()}, 'rounds': rates}))


class ParameterAverage(gluon.HybridBlock):
    """ResNet-50's trainable parameters, with the dtypes of its float16 network, and a forward that only averages
    them: logits = x times the sum of their means, so every parameter gets a gradient (the twin of a float16 step's
    update, on operators MXNet runs in float16 on a CPU)."""

    def __init__(self):
        super().__init__()
        resnet = models.get_model()
        resnet.cast('float16')
        trainable = [p for p in resnet.collect_params().values() if p.grad_req != 'null']
        with self.name_scope():
            self.names = [f'p{i}' for i in range(len(trainable))]
            for name, param in zip(self.names, trainable):
                setattr(self, name, self.params.get(name, shape=param.shape, dtype=param.dtype,
                                                    init=mx.init.Normal(0.01)))

    def hybrid_forward(self, F, x, **params):
        total = F.add_n(*[F.cast(F.mean(params[name]), dtype='float16') for name in self.names])
        return F.broadcast_mul(x, F.reshape(total, (1, 1)))


def overflow_check_ms(args, order):
    """(milliseconds per step, {what: host milliseconds to queue it}) of the recipe's float16 step with
    --overflow-check `order` (the ParameterAverage twin, batch --batch-size of --num-classes, the loss read at once
    as on a CPU), after the warm-up steps the recipe leaves out; 'update' and, after-update, 'copies' queued."""
    import train
    from rn50.config import resolve
    from rn50.training.step import StepSettings, TrainingStep
    from rn50.world import devices, workers
    flags, origin = train.parse_flags(['--num-classes', str(args.num_classes), '--batch-size', str(args.batch_size),
                                       '--overflow-check', order, '--label-smoothing', '0'])
    flags = resolve.for_run(flags, origin, on_gpu=True)[0]     # the GPU's float16 and its optimizer settings
    net = ParameterAverage()
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True)
    world = workers.World(workers.Communicator.start('device'), devices.Devices((mx.cpu(),), 'cpu'))
    step = TrainingStep(net, world, StepSettings.of(flags), seed=1)
    queued = {'update': [], 'copies': []}
    for what, owner, name in (('update', step.gluon_trainer, 'update'), ('copies', step.undo, 'keep')):
        if owner is not None:
            setattr(owner, name, timed(getattr(owner, name), queued[what]))
    images = mx.nd.random.uniform(-1, 1, (args.batch_size, args.num_classes)).astype('float16')
    labels = mx.nd.array([i % args.num_classes for i in range(args.batch_size)])
    batch = mx.io.DataBatch(data=[images], label=[labels])
    durations = []
    for iteration in range(args.iters):
        start = time.time()
        step.run(batch, 0, iteration, 0.1).asscalar()
        durations.append(time.time() - start)
    steady = logs.steady_durations(durations)
    host = {what: round(1000 * min(seconds[1:]), 1) for what, seconds in queued.items() if seconds[1:]}
    return 1000 * sum(steady) / len(steady), host


def timed(function, seconds):
    """`function`, its wall time appended to `seconds` at every call."""
    def call(*args, **kwargs):
        start = time.time()
        result = function(*args, **kwargs)
        seconds.append(time.time() - start)
        return result
    return call


def overflow_checks(args):
    """overflow_check_ms of both orders in turns (the order reversed every other round), the best of --rounds."""
    times = {order: [] for order in ('after-update', 'before-update')}
    host = {}
    for round_index in range(args.rounds):
        for order in (list(times) if round_index % 2 == 0 else list(times)[::-1]):
            step_ms, host[order] = overflow_check_ms(args, order)
            times[order].append(round(step_ms, 1))
    best = {order: min(values) for order, values in times.items()}
    print(json.dumps({'batch_size': args.batch_size, 'cpu': cpu.identity(), 'ms_per_step': best,
                      'undo_ms': round(best['after-update'] - best['before-update'], 1),
                      'host_ms_to_queue': host, 'rounds': times}))


def main():
    args = parse_args()
    if args.overflow_check:
        overflow_checks(args)
        return
    if args.pieces:
        pieces(args)
        return
    if args.environment:
        environment(args)
        return
    with_pytorch = interpreter.can_import('torch')   # pytorch_peer.py finds .venv-consumers by itself
    rounds = {'recipe': [], 'bare': []}
    peak_mb = {}
    pytorch_version = None
    if with_pytorch:
        rounds['pytorch'] = []
    for _ in range(args.rounds):
        ips, peak_mb['recipe'] = recipe_ips(args)
        rounds['recipe'].append(round(ips, 2))
        rounds['bare'].append(round(bare_ips(args), 2))
        if with_pytorch:
            ips, pytorch_version = pytorch_run(args)
            rounds['pytorch'].append(ips)
    peak_mb['bare'] = logs.peak_memory_mb()
    best = {name: max(values) for name, values in rounds.items()}
    results = {'batch_size': args.batch_size, 'image_size': args.image_size, 'amp': args.amp,
               'cpu': cpu.identity(), 'cpu_flags': sorted(cpu.cpu_flags() & DISPATCH_FLAGS),
               'onednn': cpu.describe(), 'recipe_ips': best['recipe'], 'bare_ips': best['bare'],
               'ratio': round(best['recipe'] / best['bare'], 3)}
    if with_pytorch:
        results.update(pytorch_ips=best['pytorch'], torch=pytorch_version,
                       ratio_to_pytorch=round(best['recipe'] / best['pytorch'], 3))
    else:
        results['pytorch'] = 'not installed (make consumers)'
    results.update(rounds=rounds, peak_memory_mb={name: round(mb) for name, mb in peak_mb.items()})
    print(json.dumps(results))


if __name__ == '__main__':
    main()
