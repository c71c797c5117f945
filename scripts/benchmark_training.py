#!/usr/bin/env python
"""The recipe's training throughput against a bare hybridized Gluon loop on the same network, in one run.

    python scripts/benchmark_training.py [--batch-size 32] [--iters 12] [--image-size 224] [--amp]

Both train ResNet-50 v1.5 (float32, or AMP with --amp) on synthetic data on this machine: the recipe through
`train.py --data-backend synthetic --mode train --benchmark-iters N` (its epoch `train.ips`, warm-up iterations
left out), the bare loop as forward, backward and SGD step with one host sync per iteration, timed after the
same warm-up. Prints both, their ratio (the recipe is held to >= 0.97), and peak resident memory.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import logs  # noqa: E402
import models  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--iters', type=int, default=12, help='iterations per measurement (the first is warm-up)')
    parser.add_argument('--image-size', type=int, default=224)
    parser.add_argument('--amp', action='store_true', help='bfloat16 AMP on CPU, float16 on GPU')
    return parser.parse_args()


def recipe_ips(args):
    with tempfile.TemporaryDirectory() as workspace:
        command = [sys.executable, os.path.join(HERE, 'train.py'), '--data-backend', 'synthetic', '--mode', 'train',
                   '--batch-size', str(args.batch_size), '--benchmark-iters', str(args.iters), '--num-epochs', '1',
                   '--image-shape', f'3,{args.image_size},{args.image_size}', '--workspace', workspace,
                   '--dtype', 'float32', '--seed', '1'] + (['--amp'] if args.amp else [])
        subprocess.run(command, check=True, capture_output=True)
        epoch = [r for r in logs.read_dllogger(os.path.join(workspace, 'dllogger_log.log')) if r['step'] == [0]]
        return epoch[0]['data']['train.ips']


def bare_ips(args):
    if args.amp:
        from mxnet.contrib import amp
        amp.init(target_dtype='bfloat16' if mx.context.num_gpus() == 0 else 'float16')
    net = models.get_model()
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01, 'momentum': 0.875})
    images = mx.nd.random.uniform(-1, 1, (args.batch_size, 3, args.image_size, args.image_size))
    labels = mx.nd.array([i % 1000 for i in range(args.batch_size)])
    durations = []
    for _ in range(args.iters):
        start = time.time()
        with autograd.record():
            loss = loss_fn(net(images), labels)
        loss.backward()
        trainer.step(args.batch_size)
        loss.mean().asscalar()
        durations.append(time.time() - start)
    steady = durations[max(1, min(len(durations) // 10, 100)):]
    return args.batch_size / (sum(steady) / len(steady))


def main():
    args = parse_args()
    recipe = recipe_ips(args)
    bare = bare_ips(args)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({'batch_size': args.batch_size, 'image_size': args.image_size, 'amp': args.amp,
                      'recipe_ips': round(recipe, 2), 'bare_ips': round(bare, 2), 'ratio': round(recipe / bare, 3),
                      'bare_peak_memory_mb': round(peak)}))


if __name__ == '__main__':
    main()
