#!/usr/bin/env python3
"""Time to read and convert a ResNet-50 checkpoint of every format weight_origins.py knows into this recipe's
float32 NCHW ResNet-50 (the target is 5 s each).

    python scripts/benchmark_convert.py [--rounds 3] [--dir DIR]

Writes, from one randomly initialised ResNet-50 (1000 classes): this recipe's float32 NCHW .params and its
GPU layout (float16, OHWI, 4-channel stem), NVIDIA's original recipe in float32 and in float16 with fused
names, GluonCV resnet50_v1b names, and torchvision names as .safetensors and .npz
(tests/checkpoint_formats.py writes the documented layouts). Then, per format, `read_arrays` + `convert`
is timed `--rounds` times (the formats take turns each round, so a slow spell of a shared machine hits them
all) and the median is reported. Prints one JSON object.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import bootstrap
bootstrap.start(prepare_cpu=True, tests=True)   # the repository and tests/ importable, .venv, this CPU for MXNet

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from rn50.checkpoints import weight_loading  # noqa: E402
import checkpoint_formats as formats  # noqa: E402
import models  # noqa: E402
from rn50.checkpoints import weight_conversion  # noqa: E402


def save_params(arrays, path):
    mx.nd.save(path, {name: mx.nd.array(value, dtype=value.dtype) for name, value in arrays.items()})


def write_checkpoints(directory):
    """format label -> path of a ResNet-50 checkpoint in that format."""
    mx.random.seed(0)
    net = models.get_model(num_layers=50)
    net.initialize()
    recipe = formats.recipe_arrays(net)
    gpu = models.get_model(num_layers=50, conv_layout='NHWC', batchnorm_layout='NHWC', pooling_layout='NHWC',
                           dtype='float16', device='gpu', image_shape=(4, 224, 224))
    gpu_arrays, _ = weight_conversion.convert(recipe, gpu)
    paths = {}

    def write(label, arrays, suffix):
        path = os.path.join(directory, label + suffix)
        if suffix == '.params':
            save_params(arrays, path)
        elif suffix == '.safetensors':
            from safetensors.numpy import save_file
            save_file(arrays, path)
        else:
            np.savez(path, **arrays)
        paths[label + suffix] = path

    net.save_parameters(os.path.join(directory, 'recipe-float32-nchw.params'))
    paths['recipe-float32-nchw.params'] = os.path.join(directory, 'recipe-float32-nchw.params')
    write('recipe-float16-ohwi-4ch', gpu_arrays, '.params')
    write('nvidia-float32', formats.nvidia_arrays(recipe), '.params')
    write('nvidia-float16-fused', formats.nvidia_arrays(recipe, float16=True, fused=True), '.params')
    write('gluoncv-resnet50_v1b', formats.torch_style_arrays(recipe), '.params')
    write('torchvision', formats.torch_style_arrays(recipe, torchvision=True), '.safetensors')
    write('torchvision', formats.torch_style_arrays(recipe, torchvision=True), '.npz')
    return paths


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=3, help='timed read+convert passes per format')
    parser.add_argument('--dir', default=None, help='where to write the checkpoints (default: a temporary folder)')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.dir or scratch
        os.makedirs(directory, exist_ok=True)
        paths = write_checkpoints(directory)
        target = models.get_model(num_layers=50)       # float32 NCHW, 3 channels: converting needs no init
        times = {label: [] for label in paths}
        descriptions = {}
        for _ in range(args.rounds):
            for label, path in paths.items():
                start = time.perf_counter()
                params, descriptions[label] = weight_conversion.convert(weight_loading.read_arrays(path), target, source=label)
                times[label].append(time.perf_counter() - start)
                assert len(params) == 267
        report = {label: {'seconds_median': round(statistics.median(t), 3), 'seconds_all': [round(x, 3) for x in t],
                          'megabytes': round(os.path.getsize(paths[label]) / 2 ** 20, 1),
                          'description': descriptions[label]} for label, t in times.items()}
    print(json.dumps({'rounds': args.rounds, 'target_seconds': 5, 'formats': report}, indent=2))
    return 0 if all(entry['seconds_median'] < 5 for entry in report.values()) else 1


if __name__ == '__main__':
    sys.exit(main())
