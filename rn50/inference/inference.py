"""Forward-only: validation and its metrics (also used by training), `--mode val`, `--mode pred` with class
names, and the network made ready for them (trained weights, oneDNN fusion, INT8). `--mode export` is
export.py's.

    ./runner --mode val --dtype float32 --data-root data/demo/rec ... --workspace runs/demo --quantize int8
    ./runner --mode pred --dtype float32 ... --workspace runs/demo --data-pred cat.jpg --quantize int8

* Weights: `--load`, else the workspace's best checkpoint, else its last state (resume.inference_weights;
  trained_settings.py gives the image size of their run); never random ones, except for a `--no-metrics`
  speed measurement without `--load`.
* `--quantize int8`: post-training quantization with MXNet's oneDNN INT8 kernels (CPU only). The network is
  calibrated on the first `--calib-batches` batches of the training set, preprocessed as for validation
  (`--calib-mode naive` takes the min/max of each layer's outputs, `entropy` the KL-optimal thresholds).
  The calibrated model is saved as `<prefix>_int8-symbol.json` / `-0000.params` in the workspace with a
  `<prefix>_int8.json` that records what it was calibrated from; a later run with the same weights, network
  graph and calibration settings loads it instead of calibrating again.
* float32 on the CPU: oneDNN's graph fusion (`fused_float32`), about 12% faster. `--amp` (bfloat16 on CPU,
  float16 on GPU): workers.resolve_devices switched AMP on before the network was built; nothing to do here.
"""
import dataclasses
import hashlib
import json
import logging
import os
import time

import mxnet as mx
import numpy as np

from rn50 import files
from rn50.checkpoints import weight_files
from rn50.checkpoints import resume
from rn50.checkpoints.workspace import Workspace
from rn50 import flags
from rn50.data import classes
from rn50.data.contract import batches, device_slices, whole
from rn50.data.validation_resize import OpenCVImages, describe_val_resize
from rn50.errors import RecipeError, mxnet_message
from rn50.reports import logs
from rn50.world import memory

log = logging.getLogger(__name__)

CALIB_MODES = ('naive', 'entropy')


IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp')
# INT8 calibration reads batches of this size, not --batch-size: the ranges then depend on the calibration
# images alone, and val at any batch size and pred (one image at a time) share one calibrated model.
CALIBRATION_BATCH = 64


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
class Calibration:
    """--quantize int8's calibration, as values (`of`): --calib-mode (`mode`),
    --calib-batches (`batches`), and what the cached model records of the network (`arch`, `num_layers`,
    `num_classes`) and of its data (`data`: the training .rec, or 'synthetic')."""
    mode: str = 'naive'
    batches: int = 10
    arch: str = 'resnetv15'
    num_layers: int = 50
    num_classes: int = 1000
    data: str = 'synthetic'

    @classmethod
    def of(cls, args):
        return cls(mode=args.calib_mode, batches=args.calib_batches, arch=args.arch, num_layers=args.num_layers,
                   num_classes=args.num_classes,
                   data=args.data_train if args.data_backend != 'synthetic' else 'synthetic')


@dataclasses.dataclass(frozen=True)
class Setup:
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
    """The network val and pred run: `net` with trained weights (`setup`, a Setup: --load, else `workspace`'s), or
    its INT8 version (calibrated on `dataset`'s training images through `loaders`, the composer's loader factory:
    loaders(dataset, rank, workers, train=..., val=..., contexts=..., seed=...))."""
    if setup.random:
        log.warning('--no-metrics: measuring validation speed; weights are random unless --load is given')
        source = None
    else:
        source = resume.inference_weights(workspace, setup.load)
        weight_files.load_weights(net, source, dataset.images.mean, dataset.images.std)
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


# ----------------------------------------------------------------------------------------------------------
# Prediction


def prediction_inputs(path):
    """The image files --data-pred names: one file, or every image file of a folder and its subfolders
    (sorted by path)."""
    if path is None:
        raise RecipeError('--mode pred needs --data-pred IMAGE_OR_FOLDER')
    if os.path.isdir(path):
        files = sorted(os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names
                       if name.lower().endswith(IMAGE_SUFFIXES))
        if not files:
            raise RecipeError(f'--data-pred {path}: no image files ({" ".join(IMAGE_SUFFIXES)}) in that folder '
                              'or its subfolders')
        return files
    if not os.path.exists(path):
        raise RecipeError(f'--data-pred {path}: no such file or folder')
    return [path]


def class_names(num_classes, classes_file=None, data_files=(), kept=None):
    """Names for the `num_classes` output classes: `classes_file` (--classes), else `kept` (the classes.json a
    training run keeps beside its weights, when it exists), else classes.json beside the training or validation
    data (`data_files`), else the ImageNet names for a 1000-class model, else "class N" (classes.py reads the
    files)."""
    if classes_file:
        return classes.read_names(classes_file, num_classes)
    if kept and os.path.isfile(kept):
        return classes.read_names(kept, num_classes, flag='the weights\' run\'s')
    path = classes.dataset_file(*data_files)
    if path:
        return classes.read_names(path, num_classes, flag='the dataset\'s')
    if num_classes == 1000:
        return classes.read_names(classes.IMAGENET_NAMES,
                                  1000, flag='the recipe\'s')
    return [f'class {i}' for i in range(num_classes)]


def class_names_of(args):
    """class_names of the resolved flags: --num-classes names from --classes; in val, pred and export the
    classes.json kept beside the weights (--load's, else the workspace's); else the data's classes.json (not for
    synthetic data, whose class count ignores it too), ..."""
    data_files = () if args.data_backend == 'synthetic' else (args.data_train, args.data_val)
    return class_names(args.num_classes, args.classes, data_files, kept_names(args))


def kept_names(args):
    """The classes.json beside the weights val, pred and export use (resume.find_weights), or None (training
    modes, which keep their own: fit.py; no weights)."""
    if args.mode not in ('val', 'pred', 'export'):
        return None
    try:
        weights = resume.find_weights(Workspace.of(args), args.load)
    except RecipeError:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(weights)), 'classes.json')


@dataclasses.dataclass(frozen=True)
class Prediction:
    """--mode pred's values (`of`): the image or folder to classify (`inputs`, --data-pred), how many classes to
    print (`topk`), the JSON file to write (`output`, --pred-output), the class `names` (class_names_of) and the
    --load whose name the JSON file records (`load`; else the workspace's weights)."""
    inputs: str
    names: tuple
    topk: int = 5
    output: str = None
    load: str = None

    @classmethod
    def of(cls, args):
        return cls(inputs=args.data_pred, names=tuple(class_names_of(args)), topk=args.topk, output=args.pred_output,
                   load=args.load)


def image_reader(images, dali_images):
    """The run's validation preprocessing for single images (`images`: its contract.Images), as pred and the review's
    worst images use it: load(path) and prepare(encoded bytes, name), each a normalised batch of 1 on the host.
    DALI's validation graph for a run that validates with DALI (`dali_images(images)`: dali.py's PredictionImages,
    given by the composer), else ImageRecordIter's (OpenCV)."""
    return dali_images(images) if images.val_interpolation == 'linear-antialias' else OpenCVImages(images)


def predict(net, world, prediction, validation, images, workspace, dali_images):
    """--mode pred (`prediction`, a Prediction): the top classes of each image, with probabilities, printed and
    optionally saved as JSON. An unreadable image is reported and the others are still classified. `net` comes
    from inference_network (trained weights, INT8 if asked), and computes as `validation` says (its --tta).
    Images are preprocessed as the run validates (image_reader: `images` is the run's contract.Images, `dali_images`
    dali.py's PredictionImages, given by the composer). `workspace`: the run's Workspace, whose weights the JSON file names."""
    names = prediction.names
    results = []
    inputs = prediction_inputs(prediction.inputs)
    # The run's validation preprocessing: DALI's graph for a run that validates with DALI, else ImageRecordIter's
    reader = image_reader(images, dali_images)
    log.info('Prediction with %s: %s', 'DALI (on the CPU)' if images.val_interpolation == 'linear-antialias' else
             'OpenCV', describe_val_resize(images))
    for path in inputs:
        try:
            image = reader.load(path).as_in_context(world.devices.contexts[0])
        except RecipeError as e:
            if len(inputs) > 1:   # one image alone: the error line at the end says it
                log.error('%s', e)
            results.append({'image': path, 'error': str(e)})
            continue
        probabilities = mx.nd.softmax(logits(validation, net, image).astype('float32')).asnumpy()[0]
        top = np.argsort(-probabilities)[:prediction.topk]
        print(f'{path}:')
        for rank, index in enumerate(top, 1):
            print(f'{rank:>3}. {probabilities[index] * 100:6.2f}% -> {names[index]}')
        results.append({'image': path, 'top': [{'class': int(i), 'name': names[i],
                                                 'probability': float(probabilities[i])} for i in top]})
    if prediction.output:
        weights = resume.find_weights(workspace, prediction.load)
        files.write_json(prediction.output, {'checkpoint': weights, 'trained': resume.describe_weights(weights).record(),
                                             'predictions': results})
    if all('error' in r for r in results):
        raise RecipeError(results[0]['error'] if len(results) == 1 else
                          f'none of the {len(results)} images of --data-pred {prediction.inputs} could be read '
                          f'(the first: {results[0]["error"]})')
    return results


# ----------------------------------------------------------------------------------------------------------
# INT8


def int8_network(net, source, world, calibration, workspace, dataset, loaders):
    """The calibrated INT8 network (`calibration`, a Calibration, of the weights `source`): loaded from the cache in
    `workspace` when it matches, else calibrated now on `dataset`'s training images (by rank 0, their loader from
    `loaders`; other workers wait for its files) and saved."""
    prefix = workspace.int8_prefix
    wanted = calibration_record(calibration, net, source, dataset.images)
    if world.rank == 0 and cached_calibration(prefix) != wanted:
        if os.path.exists(prefix + '.json'):
            os.remove(prefix + '.json')             # it must not vouch for the files about to be replaced
        quantized, images = calibrate(net, calibration, dataset, loaders)
        export_block(quantized, prefix)
        files.write_json(prefix + '.json', dict(wanted, calib_images=images))   # last: it vouches for the files
        log.info('Saved the calibrated INT8 model as %s-symbol.json / -0000.params', prefix)
    world.comm.barrier()
    record = cached_calibration(prefix)
    if record != wanted:
        raise RecipeError(f'{prefix}.json does not describe this calibration (another run wrote it meanwhile?)')
    log.info('INT8 model: %s-symbol.json (%s calibration on %d training images)', prefix, calibration.mode,
             record['calib_images'])
    try:
        block = mx.gluon.SymbolBlock.imports(prefix + '-symbol.json', ['data'], prefix + '-0000.params',
                                             ctx=world.devices.contexts[0])
    except (AssertionError, mx.base.MXNetError, ValueError) as e:
        raise RecipeError(f'the saved INT8 model {prefix}-symbol.json / -0000.params cannot be loaded '
                          f'({mxnet_message(e)[:200]}): delete {prefix}.json to calibrate again') from e
    block.hybridize(static_alloc=True, static_shape=True)
    return block


def calibration_record(calibration, net, source, images):
    """What an INT8 model depends on (`calibration`, the weights `source`, the network's graph, the `images` it
    takes); a cached model is reused only when all of it matches. The graph's hash makes a change to models.py
    (a new operator, say) calibrate again even with the same weights."""
    graph = net(mx.sym.var('data')).tojson().encode()
    return {'weights': os.path.abspath(source) if source else None,
            'weights_sha256': files.file_sha256(source) if source else None,
            'graph_sha256': hashlib.sha256(graph).hexdigest(),
            'arch': calibration.arch, 'num_layers': calibration.num_layers, 'num_classes': calibration.num_classes,
            'image_shape': list(images.shape_of(training=False)), 'input_layout': images.layout,
            'calib_mode': calibration.mode, 'calib_batches': calibration.batches, 'calib_batch_size': CALIBRATION_BATCH,
            'data': calibration.data}


class CalibrationRecord(dict):
    """A saved model_int8.json: equal to a wanted calibration_record when every key of that record matches
    (what it adds, such as calib_images, is what the calibration found)."""

    def __eq__(self, wanted):
        return isinstance(wanted, dict) and all(self.get(k) == v for k, v in wanted.items())

    def __ne__(self, wanted):
        return not self == wanted


def cached_calibration(prefix):
    try:
        with open(prefix + '.json') as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    ready = all(os.path.exists(prefix + suffix) for suffix in ('-symbol.json', '-0000.params'))
    return CalibrationRecord(record) if ready and isinstance(record, dict) else None


def calibrate(net, calibration, dataset, loaders):
    """Quantize `net` with ranges measured on --calib-batches training batches of CALIBRATION_BATCH images of
    `dataset` (read through `loaders`), preprocessed as validation images are (no random crops: the ranges should
    be those the model meets at inference). Returns the quantized network and how many images calibrated it."""
    from mxnet.contrib import quantization
    training_as_validation = dataclasses.replace(dataset, val=dataset.train, batch_size=CALIBRATION_BATCH)
    _, loader = loaders(training_as_validation, 0, 1, train=False, val=True)   # on the CPU: INT8's device
    count = min(calibration.batches, loader.num_batches)
    images = [whole(batch.data[0]).copyto(mx.cpu()) for batch in batches(loader, 0, 0, count)]
    log.info('Calibrating INT8 ranges (%s) on %d batches of %d training images%s', calibration.mode, count,
             loader.batch_size, '' if count == calibration.batches else
             f' (the training set has only {count} batches, not --calib-batches {calibration.batches})')
    calib_data = mx.io.NDArrayIter(data=mx.nd.concat(*images, dim=0), batch_size=loader.batch_size)
    quantized = quantization.quantize_net_v2(net, quantized_dtype='auto', calib_mode=calibration.mode,
                                             calib_data=calib_data, num_calib_examples=count * loader.batch_size,
                                             ctx=mx.cpu(), logger=None)
    quantized(images[0])   # export() saves the parameters of the graph a forward pass has built (else none)
    return quantized, count * loader.batch_size


def input_shape(images, channels=None):
    """The (C, H, W) or (H, W, C) shape of one validation (and pred, export) image in the input layout of
    `images` (the run's contract.Images), with its channels unless `channels` is given."""
    shape = images.shape_of(training=False)
    height, width = shape[1:]
    channels = channels or shape[0]
    return (height, width, channels) if images.layout == 'NHWC' else (channels, height, width)


def export_block(block, prefix):
    """block.export() to prefix-symbol.json and prefix-0000.params, each written under a temporary name and
    renamed, so a crash never leaves half a file."""
    temporary = f'{prefix}.partial'
    block.export(temporary, 0)
    for suffix in ('-symbol.json', '-0000.params'):
        os.replace(temporary + suffix, prefix + suffix)
