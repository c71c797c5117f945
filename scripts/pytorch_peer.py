#!/usr/bin/env python3
"""PyTorch's ResNet-50 v1.5 training step timed on this CPU: the peer column of benchmark_training.py.

    python scripts/pytorch_peer.py [--batch-size 32] [--iters 12] [--image-size 224] [--amp]

torchvision's resnet50 (v1.5: the stride on the 3x3 convolution), trained as torchvision's reference script
trains it on a CPU, channels_last, with `torch.autocast('cpu', torch.bfloat16)` for --amp, and the math of
benchmark_training.py's bare MXNet loop: sparse labels, SGD with momentum 0.875 and weight decay 1/32768, one
host read of the loss per iteration. Prints one JSON object: the seconds of every iteration (benchmark_training.py
leaves out the warm-up as it does for the recipe: logs.steady_durations), the torch version and its threads.
It needs the optional benchmark extras (`pip install -r requirements-bench.txt`);
it runs in a process of its own, so that PyTorch's OpenMP threads never share a process with MXNet's.
"""
import argparse
import json
import time

import bootstrap
bootstrap.start(prepare_cpu=True)   # .venv, and the OpenMP threads and oneDNN ISA cap the recipe runs with

import torch  # noqa: E402
import torchvision  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--iters', type=int, default=12, help='iterations per measurement (the first is warm-up)')
    parser.add_argument('--image-size', type=int, default=224)
    parser.add_argument('--amp', action='store_true', help='bfloat16 autocast')
    return parser.parse_args()


def iteration_seconds(batch_size, iters, image_size, amp):
    torch.manual_seed(0)
    net = torchvision.models.resnet50().to(memory_format=torch.channels_last)
    net.train()
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.875, weight_decay=1 / 32768)
    images = (torch.rand(batch_size, 3, image_size, image_size) * 2 - 1).to(memory_format=torch.channels_last)
    labels = torch.arange(batch_size) % 1000
    durations = []
    for _ in range(iters):
        start = time.time()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(net(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        durations.append(time.time() - start)
    return durations


def main():
    args = parse_args()
    seconds = iteration_seconds(args.batch_size, args.iters, args.image_size, args.amp)
    print(json.dumps({'seconds': seconds, 'torch': torch.__version__, 'threads': torch.get_num_threads()}))


if __name__ == '__main__':
    main()
