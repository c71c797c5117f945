"""Forward-only: the Inference flags, validation and its metrics (also used by training), `--mode val`, and the
network made ready for val and pred (trained weights, oneDNN fusion, INT8: int8.py). `--mode pred` is
prediction.py's, `--mode export` export.py's.

    ./runner --mode val --dtype float32 --data-root data/demo/rec ... --workspace runs/demo --quantize int8
    ./runner --mode pred --dtype float32 ... --workspace runs/demo --data-pred cat.jpg --quantize int8

* Weights: `--load`, else the workspace's best checkpoint, else its last state (resume.inference_weights;
  trained_settings.py gives the image size of their run); never random ones, except for a `--no-metrics`
  speed measurement without `--load`.
* `--quantize int8`: post-training quantization with MXNet's oneDNN INT8 kernels (CPU only; int8.py), calibrated
  once on training images and cached in the workspace.
* float32 on the CPU: oneDNN's graph fusion (`fused_float32`), about 12% faster. `--amp` (bfloat16 on CPU,
  float16 on GPU): devices.resolve_devices switched AMP on before the network was built; nothing to do here.
"""
import dataclasses
import logging
import time

import mxnet as mx
import numpy as np

from rn50.checkpoints import weight_loading
from rn50.checkpoints import resume
from rn50 import flags
from rn50.data.contract import batches, device_slices
from rn50.errors import RecipeError
from rn50.inference.int8 import CALIB_MODES, CALIBRATION_BATCH, Calibration, int8_network
from rn50.reports import logs
from rn50.world import memory

log = logging.getLogger(__name__)


def add_inference_args(parser):
    group = parser.add_argument_group('Inference', 'val, pred and export modes')
    group.add_argument('--topk', type=flags.integer(minimum=1), default=5,
                       help='pred mode: how many classes to print')
    group.add_argument('--classes', default=None,
                       help='pred mode and the review: a file naming the --num-classes classes in label order: '
                            'prepare_dataset.py\'s classes.json, {"classes": [...]} or a JSON list of names, '
                            '"folder<TAB>name" lines (prepare_dataset.py --names; sorted folder order), or one '
                            'name per line (default: the classes.json beside --data-train/--data-val, else '
                            'ImageNet names for 1000 classes)')
    group.add_argument('--pred-output', default=None, help='pred mode: write the predictions to this JSON file')
    group.add_argument('--triton', default=None, metavar='DIR',
                       help='export mode: also write a Triton Inference Server model repository to DIR (new or '
                            'empty): an ensemble of the validation preprocessing (DALI backend) and the network '
                            '(onnxruntime backend) that takes encoded images and gives probabilities, labelled; '
                            'its models batch up to --batch-size images')
    group.add_argument('--tta', choices=['flip'], default=None,
                       help='test-time augmentation in validation (during training too) and pred: flip takes the '
                            'mean of the logits of each image and its mirror image (twice the compute)')
    group.add_argument('--quantize', default=None, choices=['int8'],
                       help='val and pred modes: run the network in INT8 (oneDNN, CPU), calibrated once on the '
                            'training set and cached in the workspace')
    group.add_argument('--calib-batches', type=flags.integer(minimum=1), default=10,
                       help=f'--quantize: how many training batches of {CALIBRATION_BATCH} images calibrate the '
                            'ranges (whatever --batch-size, so every mode and batch size shares one INT8 model)')
    group.add_argument('--calib-mode', default='naive', choices=CALIB_MODES,
                       help='--quantize: naive (min/max of each layer output) or entropy (KL-divergence '
                            'thresholds; slower to calibrate)')
    return group


@dataclasses.dataclass(frozen=True)
class Validation:
    """How a validation pass runs, as values (`of`): `num_classes`, at most `iterations` batches (--benchmark-iters;
    None: all), whether it computes the accuracy and loss (`metrics`: not --no-metrics), test-time augmentation
    (`tta`: --tta, None or 'flip') and the input `layout` (the width axis a flip mirrors)."""
    num_classes: int = 1000
    iterations: int = None
    metrics: bool = True
    tta: str = None
    layout: str = 'NCHW'

    @classmethod
    def of(cls, args):
        return cls(num_classes=args.num_classes, iterations=args.benchmark_iters, metrics=not args.no_metrics,
                   tta=args.tta, layout=args.input_layout)


@dataclasses.dataclass(frozen=True)
class InferenceSetup:
    """How val and pred make the network ready, as values (`of`): its weights (`load`, --load, else the
    workspace's), `random` weights for a --mode val --no-metrics speed measurement without --load, the INT8
    `calibration` (a Calibration, or None), and the network's `dtype` and `amp` (oneDNN's float32 fusion is for
    float32 without AMP)."""
    load: str = None
    random: bool = False
    calibration: Calibration = None
    dtype: str = 'float32'
    amp: bool = False

    @classmethod
    def of(cls, args):
        return cls(load=args.load, random=bool(args.no_metrics and not args.load and args.mode == 'val'),
                   calibration=Calibration.of(args) if args.quantize else None, dtype=args.dtype, amp=args.amp)


def inference_network(net, world, setup, workspace, dataset, loaders):
    """The network val and pred run: `net` with trained weights (`setup`, an InferenceSetup: --load, else
    `workspace`'s), or its INT8 version (calibrated on `dataset`'s training images through `loaders`, the
    composer's loader factory: loaders(dataset, rank, workers, train=..., val=..., contexts=..., seed=...))."""
    if setup.random:
        log.warning('--no-metrics: measuring validation speed; weights are random unless --load is given')
        source = None
    else:
        source = resume.inference_weights(workspace, setup.load)
        weight_loading.load_weights(net, source, dataset.images.mean, dataset.images.std)
    if setup.calibration:
        return int8_network(net, source, world, setup.calibration, workspace, dataset, loaders)
    if world.devices.amp_dtype == 'bfloat16':
        return fused_bfloat16(net, world.devices, dataset.images)
    return fused_float32(net, world.devices, dataset.images, setup.dtype, setup.amp)


def fused_bfloat16(net, devices, images):
    """--amp on the CPU (bfloat16): the network converted to bfloat16 first (weights, and every operator AMP
    lists as safe; the input cast once) and then fused by oneDNN, so that each convolution with its batchnorm,
    residual addition and ReLU is one bfloat16 operator, instead of float32 fusions with casts between them."""
    from mxnet.contrib import amp
    example = mx.nd.zeros((1,) + input_shape(images), ctx=devices.contexts[0])
    net(example)     # the graph to convert: conversion reads the hybridized graph of one forward pass
    converted = amp.convert_hybrid_block(net, target_dtype='bfloat16', ctx=devices.contexts[0],
                                         cast_optional_params=True)
    if mx.runtime.Features().is_enabled('MKLDNN'):
        converted.optimize_for(example, backend='MKLDNN', static_alloc=True, static_shape=True)
        log.info('bfloat16 inference with oneDNN fusion (the network in bfloat16, then convolution + batchnorm + '
                 'add + ReLU in one operator)')
    return converted


def fused_float32(net, devices, images, dtype='float32', amp=False):
    """`net` with oneDNN's graph fusion on a oneDNN CPU build in float32 (`dtype`, without `amp`): each
    convolution with its batchnorm (folded into the weights), residual addition and ReLU becomes one operator.
    ResNet-50 ran 12% faster (same logits within 1e-5); it is for inference only, as the folded batchnorm no
    longer trains. `images`: the run's contract.Images."""
    if devices.kind != 'cpu' or amp or dtype != 'float32' or \
            not mx.runtime.Features().is_enabled('MKLDNN'):
        return net
    example = mx.nd.zeros((1,) + input_shape(images), ctx=devices.contexts[0])   # partitioning runs it once
    net.optimize_for(example, backend='MKLDNN', static_alloc=True, static_shape=True)
    log.info('float32 inference with oneDNN fusion (convolution + batchnorm + add + ReLU in one operator)')
    return net


# ----------------------------------------------------------------------------------------------------------
# Validation (every epoch of train_val, and --mode val)


def validate(validation, net, loader, world, passes_label='', outcomes=None):
    """One pass over the validation data as `validation` (a Validation) says: top-1, top-5 and loss summed over
    all workers, each image counted once (padding removed); per-batch latencies in seconds. The next batch is
    fetched (read, decoded, copied) and queued before the outputs of the current one are waited for, so that
    loading overlaps the network's compute; val.ips counts real images only. `outcomes` (a review's
    OutcomeTable, or None) gets each real image's outcome by its record position (the batch's `index`)."""
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    totals = np.zeros(4)  # correct top-1, correct top-5, loss sum, images
    timed = []            # (seconds, real images) per batch, from one batch's finish to the next
    pending = None
    tick = begin = time.time()
    for batch in batches(loader, 0, 0, validation.iterations or loader.num_batches):
        queued = queue_batch(validation, net, batch, world.devices.contexts)
        if pending is not None:
            totals += finish_batch(validation, pending, loss_fn, outcomes)
            now = time.time()
            timed.append((now - tick, pending[2]))
            tick = now
        pending = queued
    if pending is not None:
        totals += finish_batch(validation, pending, loss_fn, outcomes)
        timed.append((time.time() - tick, pending[2]))
    whole = (time.time() - begin, sum(images for _, images in timed))
    totals = world.comm.allreduce_sum(totals)
    seen = max(totals[3], 1)
    metrics = {}
    if validation.metrics:
        metrics = {'val.loss': totals[2] / seen, 'val.accuracy': totals[0] / seen}
        if validation.num_classes > 5:   # with 5 classes or fewer every image is in the top 5
            metrics['val.top_k_accuracy_5'] = totals[1] / seen
    # With one or two batches the last one computes while the first is waited for (the engine runs both), so
    # its finish-to-finish time says nothing: the whole pass is timed instead, shared out over its batches.
    steady = logs.steady_durations(timed) if len(timed) > 2 else \
        [(whole[0] / len(timed), whole[1] / len(timed))] * len(timed)
    seconds, images = (sum(column) for column in zip(*steady)) if steady else (0.0, 0)
    metrics['val.ips'] = images * world.size / seconds if seconds else 0.0
    metrics['val.latency_avg'] = seconds / len(steady) if steady else 0.0
    log.info('Validation%s%s: %d images%s', passes_label, ' (--tta flip)' if validation.tta else '', int(totals[3]),
             ''.join(f', {name} {metrics[key]:.4f}' for name, key in (('top-1', 'val.accuracy'),
                                                                      ('top-5', 'val.top_k_accuracy_5'))
                     if key in metrics))
    return metrics, [duration for duration, _ in steady]


def queue_batch(validation, net, batch, contexts):
    """(outputs, labels, real images, record positions) of `batch` over `contexts`, the network's work queued on
    MXNet's engine, not waited for."""
    images, labels = device_slices(batch.data[0], contexts), device_slices(batch.label[0], contexts)
    return [logits(validation, net, x) for x in images], labels, sum(x.shape[0] for x in images) - batch.pad, \
        batch.index


def logits(validation, net, images):
    """The network's outputs for a batch of `images`; with --tta flip (validation.tta) the mean of those of the
    images and of their mirror images (flipped along the width)."""
    if validation.tta != 'flip':
        return net(images)
    mirrored = mx.nd.flip(images, axis=validation.layout.index('W'))
    return (net(images).astype('float32') + net(mirrored).astype('float32')) / 2


def finish_batch(validation, queued, loss_fn, outcomes=None):
    """[top-1 correct, top-5 correct, loss sum, count] of a queued batch, once its outputs are computed; each real
    image's outcome added to `outcomes` (when given)."""
    outputs, labels, valid, positions = queued
    if outcomes is not None:
        record_outcomes(outcomes, outputs, labels, valid, positions)
    if validation.metrics:
        return batch_metrics(outputs, labels, valid, loss_fn)
    outputs[-1].wait_to_read()
    return np.array([0.0, 0.0, 0.0, valid])


def record_outcomes(outcomes, outputs, labels, valid, positions):
    """Add the first `valid` images of a split batch (their record `positions`) to `outcomes`: their labels and
    log-probabilities."""
    if positions is None:
        raise RecipeError('this data backend does not say which record each validation image is: no review')
    log_probabilities = np.concatenate([mx.nd.log_softmax(o.astype('float32'), axis=1).asnumpy() for o in outputs])
    truth = np.concatenate([label.asnumpy() for label in labels])
    outcomes.add(np.asarray(positions)[:valid], truth[:valid], log_probabilities[:valid])


def batch_metrics(outputs, labels, valid, loss_fn):
    """[top-1 correct, top-5 correct, loss sum, count] over the first `valid` samples of the split batch."""
    totals = np.zeros(4)
    offset = 0
    for output, label in zip(outputs, labels):
        keep = min(max(valid - offset, 0), output.shape[0])
        offset += output.shape[0]
        if keep == 0:
            continue
        output, label = output[:keep].astype('float32'), label[:keep]
        k = min(5, output.shape[1])
        top = mx.nd.topk(output, k=k, axis=1, ret_typ='indices').asnumpy()
        truth = label.asnumpy().astype(np.int64)[:, None]
        totals += [float((top[:, :1] == truth).sum()), float((top == truth).any(axis=1).sum()),
                   float(loss_fn(output, label).sum().asscalar()), keep]
    return totals


def latency_percentiles(durations):
    if not durations:
        return {}
    return {f'val.latency_{p}': float(np.percentile(durations, p)) for p in (50, 90, 95, 99, 100)}


def evaluate(net, world, seed, dataset, loaders, dllogger, validation, passes=1, outcomes=None):
    """--mode val: `passes` passes (--num-epochs, default 1) of `net`, ready from inference_network, over the
    validation data of `dataset` (a contract.Dataset, its loader from `loaders`, the composer's factory), as
    `validation` (a Validation) says: (summary, per pass, outcomes of the last pass or None). `seed`: the run's
    (synthetic data draws its images from it). `outcomes(num_images)` (the review's OutcomeTable, or None) makes
    the table the last pass fills, gathered from every worker."""
    _, val_loader = loaders(dataset, world.rank, world.size, train=False, val=True, contexts=world.devices.contexts,
                            seed=seed)
    if val_loader is None:
        raise RecipeError('--mode val needs validation data: pass --data-val (and --data-val-idx)')
    # A small set (the quick start's 32 images at the runner's -b 192) is read in a batch of its size, rounded up
    # to the workers' devices, instead of a batch that is mostly padding.
    devices = world.size * len(world.devices.contexts)
    fitting = -(-val_loader.num_examples // devices) * devices
    if dataset.batch_size >= 2 * val_loader.num_examples and fitting < dataset.batch_size:
        log.info('--batch-size %d is over twice the %d validation images: validating with a batch of %d instead (no '
                 'padding to compute)', dataset.batch_size, val_loader.num_examples, fitting)
        dataset = dataclasses.replace(dataset, batch_size=fitting)
        _, val_loader = loaders(dataset, world.rank, world.size, train=False, val=True,
                                contexts=world.devices.contexts, seed=seed)
    memory.check_batch_against_data(val_loader, world)
    all_durations, history = [], []
    table = None if outcomes is None else outcomes(val_loader.num_examples)
    for epoch in range(passes):
        metrics, durations = validate(validation, net, val_loader, world, f' pass {epoch}',
                                      table if epoch == passes - 1 else None)
        metrics.update(latency_percentiles(durations))
        dllogger.log((epoch,), metrics)
        all_durations += durations
        history.append(metrics)
    summary = {k: float(np.mean([m[k] for m in history])) for k in history[0]}
    for key in ('val.accuracy', 'val.top_k_accuracy_5'):
        if key in summary:
            summary[key] = max(m[key] for m in history)
    summary.update(latency_percentiles(all_durations))
    return summary, history, None if table is None else table.gathered(world.comm)


def input_shape(images, channels=None):
    """The (C, H, W) or (H, W, C) shape of one validation (and pred, export) image in the input layout of
    `images` (the run's contract.Images), with its channels unless `channels` is given."""
    shape = images.shape_of(training=False)
    height, width = shape[1:]
    channels = channels or shape[0]
    return (height, width, channels) if images.layout == 'NHWC' else (channels, height, width)
