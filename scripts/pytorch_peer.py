#!/usr/bin/env python3
"""PyTorch's ResNet-50 v1.5 on this CPU: the peer of benchmark_training.py (its training step timed) and of
benchmark_time_to_accuracy.py (the demo's whole job trained).

    python scripts/pytorch_peer.py [--batch-size 32] [--iters 12] [--image-size 224] [--amp]
    python scripts/pytorch_peer.py --train data/demo/images [--epochs 15] [--amp]

The step: torchvision's resnet50 (v1.5: the stride on the 3x3 convolution), trained as torchvision's reference
script trains it on a CPU, channels_last, with `torch.autocast('cpu', torch.bfloat16)` for --amp, and the math of
benchmark_training.py's bare MXNet loop: sparse labels, SGD with momentum 0.875 and weight decay 1/32768, one
host read of the loss per iteration. Prints one JSON object: the seconds of every iteration (benchmark_training.py
leaves out the warm-up as it does for the recipe: logs.steady_durations), the torch version and its threads.

--train: the job of scripts/demo.sh (the digits: FOLDER/train and FOLDER/val of class folders) as torchvision's
classification reference (references/classification/train.py) trains it: ImageFolder, one loader process, the
reference's training transforms (RandomResizedCrop at the demo's 32 with its 50-100% of the area, a horizontal
flip, the recipe's mean and std) and validation transforms (resize to 36, centre crop 32), resnet50 with
`zero_init_residual=True` in channels_last, CrossEntropyLoss with label smoothing 0.1, SGD with momentum 0.875
and weight decay 1/32768 on the weights only (the reference's --norm-weight-decay 0 and --bias-weight-decay 0),
the demo's schedule per iteration (0.032 at batch 32, 2 epochs of linear warm-up from 0, then a cosine to 0) for
--epochs. Prints one JSON line per epoch: its end's time.time(), the validation top-1 and the training images/s.

It runs with the project's environment that has PyTorch, .venv-consumers (`make consumers`; `make test` makes
it): in a process of its own, so that PyTorch's OpenMP threads never
share a process with MXNet's.
"""
import argparse
import json
import math
import time

import bootstrap
bootstrap.on_path()
from rn50.launch import interpreter  # noqa: E402
interpreter.use_project_python('torch')   # .venv or .venv-consumers, whichever has PyTorch
from rn50.world import cpu  # noqa: E402
cpu.prepare_process()   # the OpenMP threads and oneDNN ISA cap the recipe runs with

import torch  # noqa: E402
import torchvision  # noqa: E402

# The demo's job (scripts/demo.sh and the recipe's defaults): what --train trains.
DEMO = {'batch_size': 32, 'lr': 0.032, 'warmup_epochs': 2, 'momentum': 0.875, 'weight_decay': 1 / 32768,
        'label_smoothing': 0.1, 'size': 32, 'resize': 36, 'min_area': 0.5, 'classes': 10,
        'mean': (123.68, 116.779, 103.939), 'std': (58.393, 57.12, 57.375)}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--iters', type=int, default=12, help='iterations per measurement (the first is warm-up)')
    parser.add_argument('--image-size', type=int, default=224)
    parser.add_argument('--amp', action='store_true', help='bfloat16 autocast')
    parser.add_argument('--train', metavar='FOLDER', help='train the demo\'s job on FOLDER/train, FOLDER/val')
    parser.add_argument('--epochs', type=int, default=15, help='--train: epochs (the demo\'s 15)')
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


def demo_loaders(folder):
    """(training loader, validation loader) of the demo's images, as torchvision's reference builds them."""
    from torchvision import transforms
    normalise = transforms.Normalize([m / 255 for m in DEMO['mean']], [s / 255 for s in DEMO['std']])
    training = transforms.Compose([
        transforms.RandomResizedCrop(DEMO['size'], scale=(DEMO['min_area'], 1.0), antialias=True),
        transforms.RandomHorizontalFlip(), transforms.PILToTensor(), transforms.ConvertImageDtype(torch.float),
        normalise])
    validation = transforms.Compose([
        transforms.Resize(DEMO['resize'], antialias=True), transforms.CenterCrop(DEMO['size']),
        transforms.PILToTensor(), transforms.ConvertImageDtype(torch.float), normalise])
    train_set = torchvision.datasets.ImageFolder(f'{folder}/train', training)
    val_set = torchvision.datasets.ImageFolder(f'{folder}/val', validation)
    return (torch.utils.data.DataLoader(train_set, batch_size=DEMO['batch_size'], shuffle=True, num_workers=1),
            torch.utils.data.DataLoader(val_set, batch_size=DEMO['batch_size'], num_workers=1))


def demo_rate(step, steps_per_epoch, epochs):
    """The demo's learning rate at optimizer step `step`: linear from 0 over the warm-up, then a cosine to 0."""
    warmup, total = DEMO['warmup_epochs'] * steps_per_epoch, epochs * steps_per_epoch
    if step < warmup:
        return DEMO['lr'] * step / warmup
    return DEMO['lr'] * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def train_demo(folder, epochs, amp):
    """--train: one JSON line per epoch (the module docstring)."""
    torch.manual_seed(1)
    train_loader, val_loader = demo_loaders(folder)
    net = torchvision.models.resnet50(num_classes=DEMO['classes'], zero_init_residual=True)
    net = net.to(memory_format=torch.channels_last)
    decayed = [p for name, p in net.named_parameters() if p.ndim > 1]
    plain = [p for name, p in net.named_parameters() if p.ndim <= 1]      # batchnorm and biases
    optimizer = torch.optim.SGD([{'params': decayed, 'weight_decay': DEMO['weight_decay']},
                                 {'params': plain, 'weight_decay': 0.0}], lr=0.0, momentum=DEMO['momentum'])
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=DEMO['label_smoothing'])
    step = 0
    for epoch in range(epochs):
        net.train()
        start, images = time.time(), 0
        for inputs, labels in train_loader:
            for group in optimizer.param_groups:
                group['lr'] = demo_rate(step, len(train_loader), epochs)
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):
                loss = loss_fn(net(inputs.to(memory_format=torch.channels_last)), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss.item()
            step += 1
            images += len(labels)
        rate = images / (time.time() - start)
        net.eval()
        right = seen = 0
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):
            for inputs, labels in val_loader:
                right += int((net(inputs.to(memory_format=torch.channels_last)).argmax(1) == labels).sum())
                seen += len(labels)
        print(json.dumps({'epoch': epoch, 'time': time.time(), 'top1': right / seen, 'train_ips': rate}), flush=True)


def main():
    args = parse_args()
    if args.train:
        train_demo(args.train, args.epochs, args.amp)
        return
    seconds = iteration_seconds(args.batch_size, args.iters, args.image_size, args.amp)
    print(json.dumps({'seconds': seconds, 'torch': torch.__version__, 'threads': torch.get_num_threads()}))


if __name__ == '__main__':
    main()
