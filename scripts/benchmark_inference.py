#!/usr/bin/env python3
"""Validation throughput and top-1 of one trained model in float32 MXNet, bfloat16 MXNet, INT8 MXNet,
onnxruntime and OpenVINO (float32 and bfloat16), in one run on the same preprocessed batches.

    python scripts/benchmark_inference.py [--rounds 5] -- TRAIN_PY_FLAGS...
    python scripts/benchmark_inference.py -- --workspace runs/demo --data-train data/demo/rec/train.rec \\
        --data-val data/demo/rec/val.rec --num-classes 10 --image-shape 3,32,32 --data-val-resize 36 \\
        --batch-size 64 --dtype float32

The flags after `--` are train.py's and name the model and data as `--mode val` would (weights from
--load or the workspace). The validation set is decoded once into memory, so only the network is timed.
After a warm-up pass each (which also measures top-1), the engines take turns, one pass over the set each
per round, for `--rounds` rounds: a shared machine's slow spells then hit all of them, and the median
round is reported. INT8 uses int8.py's cached calibration
(--calib-batches, --calib-mode); onnxruntime runs the model `--mode export` writes; bfloat16 is --amp's
network (converted to bfloat16, then fused: evaluation.fused_bfloat16), on CPUs with avx512_bf16 or AMX.
OpenVINO, an optional benchmark extra (`pip install -r requirements-bench.txt`), compiles the same ONNX
model for the CPU with INFERENCE_PRECISION_HINT f32, and bf16 where the CPU has avx512_bf16 or AMX.
Prints one JSON object.
"""
import argparse
import functools
import json
import os
import time

import bootstrap
bootstrap.start(prepare_cpu=True)   # the repository importable, .venv, this CPU prepared for MXNet

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import dali  # noqa: E402
import data  # noqa: E402
import models  # noqa: E402
import train  # noqa: E402
from rn50.checkpoints import weight_loading  # noqa: E402
from rn50.checkpoints.workspace import Workspace  # noqa: E402
from rn50.checkpoints import resume  # noqa: E402
from rn50.config import resolve  # noqa: E402
from rn50.data import contract  # noqa: E402
from rn50.inference import export# noqa: E402
from rn50.inference import evaluation# noqa: E402
from rn50.inference.int8 import Calibration, int8_network  # noqa: E402
from rn50.nets.network import Network  # noqa: E402
from rn50.world import cpu  # noqa: E402
from rn50.world import devices, workers  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--rounds', type=int, default=5, help='timed passes over the validation set per engine')
    parser.add_argument('train_flags', nargs=argparse.REMAINDER, help='train.py flags, after --')
    options = parser.parse_args()
    flags = options.train_flags[1:] if options.train_flags[:1] == ['--'] else options.train_flags
    return options, train.parse_flags(flags + ['--mode', 'val'])


def validation_batches(args, world):
    """The whole validation set as (images, labels, real sample count) batches in memory."""
    _, loader = train.get_loaders(args, 0, 1, train=False, val=True)
    return [(contract.joined(batch.data[0]).copyto(mx.cpu()), contract.joined(batch.label[0]).asnumpy(),
             len(contract.joined(batch.label[0])) - batch.pad) for batch in loader.epoch(0)]


def top1(run, batches):
    """Top-1 of `run(images) -> logits as numpy` over the real (unpadded) images; also the warm-up pass."""
    correct = sum(int((run(images)[:real].argmax(1) == labels[:real]).sum()) for images, labels, real in batches)
    return round(correct / sum(real for _, _, real in batches), 4)


def images_per_second(run, batches):
    start = time.time()
    for images, _, _ in batches:
        run(images)
    return sum(len(labels) for _, labels, _ in batches) / (time.time() - start)


def compare(engines, batches, rounds):
    """{engine: [median images/s, top-1]} with the engines' timed passes interleaved round by round."""
    accuracy = {name: top1(run, batches) for name, run in engines.items()}
    speeds = {name: [] for name in engines}
    for _ in range(rounds):
        for name, run in engines.items():
            speeds[name].append(images_per_second(run, batches))
    return {name: [round(float(np.median(speeds[name])), 1), accuracy[name]] for name in engines}


def openvino_engines(onnx_path, bfloat16, results):
    """{'openvino float32': run, 'openvino bfloat16': run} for the exported ONNX model (bfloat16 where the CPU
    has it: `bfloat16`); {} with a note in `results` where OpenVINO is not installed."""
    try:
        import openvino
    except ImportError:
        results['openvino'] = 'not installed (pip install -r requirements-bench.txt)'
        return {}
    core = openvino.Core()
    results['openvino_version'] = openvino.__version__
    precisions = {'openvino float32': 'f32'}
    if bfloat16:
        precisions['openvino bfloat16'] = 'bf16'
    engines = {}
    for name, precision in precisions.items():
        compiled = core.compile_model(core.read_model(onnx_path), 'CPU', {'INFERENCE_PRECISION_HINT': precision})
        request, output = compiled.create_infer_request(), compiled.output(0)
        engines[name] = functools.partial(lambda x, request, output: request.infer([x.asnumpy()])[output],
                                          request=request, output=output)
    return engines


def main():
    options, (args, origin) = parse_args()
    comm = workers.Communicator.start(args.kv_store)
    args, origin = resolve.for_run(args, origin, on_gpu=mx.context.num_gpus() > 0)
    world = workers.World(comm, devices.resolve_devices(comm, devices.DeviceRequest.of(args)))
    data.check_backend(args, origin.given, on_gpu=mx.context.num_gpus() > 0)
    workers.resolve_seed(args.seed, world)
    network = Network.of(args)
    net = models.build(network, world.devices.kind)
    net.initialize(ctx=list(world.devices.contexts))
    net.hybridize(static_alloc=True, static_shape=True)
    batches = validation_batches(args, world)
    results = {'batch_size': args.batch_size, 'images': sum(real for _, _, real in batches),
               'cores': os.cpu_count(), 'cpu': cpu.identity(), 'onednn': cpu.describe()}

    # In this order: INT8 calibration needs the unfused network, which float32 inference then fuses.
    workspace, dataset, loaders = Workspace.of(args), contract.Dataset.of(args), train.Loaders.of(args)
    exported = export.export(export.Export.of(args), network, world, workspace, dataset, loaders,
                             functools.partial(models.build, device='cpu'),
                             functools.partial(dali.serialize_preprocessing, dataset.images,
                                               args.dali_validation_threads))
    weight_loading.load_weights(net, resume.find_weights(workspace, args.load), args.rgb_mean, args.rgb_std)
    engines = {}
    try:
        import onnxruntime
        session = onnxruntime.InferenceSession(exported['onnx'], providers=['CPUExecutionProvider'])
        engines['onnxruntime'] = lambda x: session.run(None, {'data': x.asnumpy()})[0]
    except ImportError:
        results['onnxruntime'] = 'not installed'
    has_bfloat16 = bool(cpu.cpu_flags() & {'avx512_bf16', 'amx_bf16'})
    engines.update(openvino_engines(exported['onnx'], has_bfloat16, results))
    int8 = int8_network(net, resume.find_weights(workspace, args.load), world, Calibration.of(args), workspace,
                        dataset, loaders)
    engines['int8'] = lambda x: int8(x).asnumpy()
    if has_bfloat16:    # --amp's network: converted to bfloat16, then fused
        bfloat16 = evaluation.fused_bfloat16(net, world.devices, dataset.images)
        engines['bfloat16'] = lambda x: bfloat16(x).astype('float32').asnumpy()
    else:
        results['bfloat16'] = 'this CPU has neither avx512_bf16 nor AMX'
    float32 = evaluation.inference_network(net, world, evaluation.InferenceSetup.of(args), workspace, dataset, loaders)
    engines['float32'] = lambda x: float32(x).asnumpy()
    results.update(compare(engines, batches, options.rounds))
    results['int8_speedup'] = round(results['int8'][0] / results['float32'][0], 2)
    if 'bfloat16' in engines:
        results['bfloat16_speedup'] = round(results['bfloat16'][0] / results['float32'][0], 2)
    if 'onnxruntime' in engines:
        results['float32_vs_onnxruntime'] = round(results['float32'][0] / results['onnxruntime'][0], 3)
    for precision in ('float32', 'bfloat16'):
        if f'openvino {precision}' in engines and precision in engines:
            results[f'{precision}_vs_openvino'] = round(results[precision][0] / results[f'openvino {precision}'][0], 3)
    results['format'] = '[images/s, top-1]'
    print(json.dumps(results))


if __name__ == '__main__':
    main()
