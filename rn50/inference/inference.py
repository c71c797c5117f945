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
from rn50.config import resolve
from rn50.data import classes
from rn50.data.contract import batches, device_slices, image_shape, whole
from rn50.data.validation_resize import describe_val_resize, load_image, val_interpolation
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
                       help='pred mode: a file naming the --num-classes classes in label order: '
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


def check_inference_flags(args):
    """RecipeError for inference flags that cannot work with the mode, and for a class-name file pred cannot
    use. INT8 runs on the CPU, a GPU node's too (rn50/config/resolve.py)."""
    if args.mode == 'pred' and not args.test_io:
        class_names(args)
    if args.triton and args.mode != 'export':
        raise RecipeError(f'--triton writes a model repository in --mode export, not --mode {args.mode}')
    if args.quantize is None:
        return
    if args.mode not in ('val', 'pred'):
        raise RecipeError(f'--quantize int8 is for --mode val and pred (INT8 inference), not --mode {args.mode}; '
                          'to deploy the INT8 model, run --mode val --quantize int8 and use the '
                          f'{args.model_prefix}_int8-symbol.json/-0000.params it saves')
    if args.amp or args.dtype != 'float32':
        raise RecipeError('--quantize int8 starts from the float32 network: leave out --amp and use '
                          '--dtype float32')
    if args.data_backend != 'synthetic' and not args.data_train:
        raise RecipeError('--quantize int8 calibrates on the training set: pass --data-train (or --data-root '
                          'to the runner)')


def inference_network(args, net, world, get_loaders):
    """The network val and pred run: `net` with trained weights, or its INT8 version."""
    if args.no_metrics and not args.load and args.mode == 'val':
        log.warning('--no-metrics: measuring validation speed; weights are random unless --load is given')
        source = None
    else:
        source = resume.inference_weights(Workspace.of(args), args.load)
        weight_files.load_weights(net, source, args.rgb_mean, args.rgb_std)
    if args.quantize:
        return int8_network(args, net, source, world, get_loaders)
    if world.devices.amp_dtype == 'bfloat16':
        return fused_bfloat16(args, net, world.devices)
    return fused_float32(args, net, world.devices)


def fused_bfloat16(args, net, devices):
    """--amp on the CPU (bfloat16): the network converted to bfloat16 first (weights, and every operator AMP
    lists as safe; the input cast once) and then fused by oneDNN, so that each convolution with its batchnorm,
    residual addition and ReLU is one bfloat16 operator, instead of float32 fusions with casts between them."""
    from mxnet.contrib import amp
    example = mx.nd.zeros((1,) + input_shape(args), ctx=devices.contexts[0])
    net(example)     # the graph to convert: conversion reads the hybridized graph of one forward pass
    converted = amp.convert_hybrid_block(net, target_dtype='bfloat16', ctx=devices.contexts[0],
                                         cast_optional_params=True)
    if mx.runtime.Features().is_enabled('MKLDNN'):
        converted.optimize_for(example, backend='MKLDNN', static_alloc=True, static_shape=True)
        log.info('bfloat16 inference with oneDNN fusion (the network in bfloat16, then convolution + batchnorm + '
                 'add + ReLU in one operator)')
    return converted


def fused_float32(args, net, devices):
    """`net` with oneDNN's graph fusion on a oneDNN CPU build in float32: each convolution with its batchnorm
    (folded into the weights), residual addition and ReLU becomes one operator. ResNet-50 ran 12% faster
    (same logits within 1e-5); it is for inference only, as the folded batchnorm no longer trains."""
    if devices.kind != 'cpu' or args.amp or args.dtype != 'float32' or \
            not mx.runtime.Features().is_enabled('MKLDNN'):
        return net
    example = mx.nd.zeros((1,) + input_shape(args), ctx=devices.contexts[0])   # partitioning runs it once
    net.optimize_for(example, backend='MKLDNN', static_alloc=True, static_shape=True)
    log.info('float32 inference with oneDNN fusion (convolution + batchnorm + add + ReLU in one operator)')
    return net


# ----------------------------------------------------------------------------------------------------------
# Validation (every epoch of train_val, and --mode val)


def validate(args, net, loader, world, passes_label=''):
    """One pass over the validation data: top-1, top-5 and loss summed over all workers, each image counted
    once (padding removed); per-batch latencies in seconds. The next batch is fetched (read, decoded,
    copied) and queued before the outputs of the current one are waited for, so that loading overlaps the
    network's compute; val.ips counts real images only."""
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    totals = np.zeros(4)  # correct top-1, correct top-5, loss sum, images
    timed = []            # (seconds, real images) per batch, from one batch's finish to the next
    pending = None
    tick = begin = time.time()
    for batch in batches(loader, 0, 0, args.benchmark_iters or loader.num_batches):
        queued = queue_batch(args, net, batch, world.devices.contexts)
        if pending is not None:
            totals += finish_batch(args, pending, loss_fn)
            now = time.time()
            timed.append((now - tick, pending[2]))
            tick = now
        pending = queued
    if pending is not None:
        totals += finish_batch(args, pending, loss_fn)
        timed.append((time.time() - tick, pending[2]))
    whole = (time.time() - begin, sum(images for _, images in timed))
    totals = world.comm.allreduce_sum(totals)
    seen = max(totals[3], 1)
    metrics = {}
    if not args.no_metrics:
        metrics = {'val.loss': totals[2] / seen, 'val.accuracy': totals[0] / seen}
        if args.num_classes > 5:   # with 5 classes or fewer every image is in the top 5
            metrics['val.top_k_accuracy_5'] = totals[1] / seen
    # With one or two batches the last one computes while the first is waited for (the engine runs both), so
    # its finish-to-finish time says nothing: the whole pass is timed instead, shared out over its batches.
    steady = logs.steady_durations(timed) if len(timed) > 2 else \
        [(whole[0] / len(timed), whole[1] / len(timed))] * len(timed)
    seconds, images = (sum(column) for column in zip(*steady)) if steady else (0.0, 0)
    metrics['val.ips'] = images * world.size / seconds if seconds else 0.0
    metrics['val.latency_avg'] = seconds / len(steady) if steady else 0.0
    log.info('Validation%s%s: %d images%s', passes_label, ' (--tta flip)' if args.tta else '', int(totals[3]), ''.join(
        f', {name} {metrics[key]:.4f}' for name, key in (('top-1', 'val.accuracy'), ('top-5', 'val.top_k_accuracy_5'))
        if key in metrics))
    return metrics, [duration for duration, _ in steady]


def queue_batch(args, net, batch, contexts):
    """(outputs, labels, real images) of `batch` over `contexts`, the network's work queued on MXNet's engine, not
    waited for."""
    images, labels = device_slices(batch.data[0], contexts), device_slices(batch.label[0], contexts)
    return [logits(args, net, x) for x in images], labels, sum(x.shape[0] for x in images) - batch.pad


def logits(args, net, images):
    """The network's outputs for a batch of `images`; with --tta flip the mean of those of the images and of
    their mirror images (flipped along the width)."""
    if args.tta != 'flip':
        return net(images)
    mirrored = mx.nd.flip(images, axis=args.input_layout.index('W'))
    return (net(images).astype('float32') + net(mirrored).astype('float32')) / 2


def finish_batch(args, queued, loss_fn):
    """[top-1 correct, top-5 correct, loss sum, count] of a queued batch, once its outputs are computed."""
    outputs, labels, valid = queued
    if not args.no_metrics:
        return batch_metrics(outputs, labels, valid, loss_fn)
    outputs[-1].wait_to_read()
    return np.array([0.0, 0.0, 0.0, valid])


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


def evaluate(args, net, world, seed, get_loaders, dllogger):
    """--mode val: --num-epochs passes (default 1) of `net`, ready from inference_network: (summary, per pass).
    `seed`: the run's (synthetic data draws its images from it)."""
    _, val_loader = get_loaders(args, world.rank, world.size, train=False, val=True,
                                contexts=world.devices.contexts, seed=seed)
    if val_loader is None:
        raise RecipeError('--mode val needs validation data: pass --data-val (and --data-val-idx)')
    # A small set (the quick start's 32 images at the runner's -b 192) is read in a batch of its size, rounded up
    # to the workers' devices, instead of a batch that is mostly padding.
    devices = world.size * len(world.devices.contexts)
    fitting = -(-val_loader.num_examples // devices) * devices
    if args.batch_size >= 2 * val_loader.num_examples and fitting < args.batch_size:
        log.info('--batch-size %d is over twice the %d validation images: validating with a batch of %d instead (no '
                 'padding to compute)', args.batch_size, val_loader.num_examples, fitting)
        args = resolve.replaced(args, batch_size=fitting)
        _, val_loader = get_loaders(args, world.rank, world.size, train=False, val=True,
                                    contexts=world.devices.contexts, seed=seed)
    memory.check_batch_against_data(val_loader, world)
    all_durations, history = [], []
    for epoch in range(args.num_epochs):
        metrics, durations = validate(args, net, val_loader, world, f' pass {epoch}')
        metrics.update(latency_percentiles(durations))
        dllogger.log((epoch,), metrics)
        all_durations += durations
        history.append(metrics)
    summary = {k: float(np.mean([m[k] for m in history])) for k in history[0]}
    for key in ('val.accuracy', 'val.top_k_accuracy_5'):
        if key in summary:
            summary[key] = max(m[key] for m in history)
    summary.update(latency_percentiles(all_durations))
    return summary, history


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


def class_names(args):
    """Names for the output classes: --classes, else classes.json beside the training or validation data,
    else the ImageNet names for a 1000-class model, else "class N" (classes.py reads the files)."""
    if args.classes:
        return classes.read_names(args.classes, args.num_classes)
    path = classes.dataset_file(args.data_train, args.data_val)
    if path:
        return classes.read_names(path, args.num_classes, flag='the dataset\'s')
    if args.num_classes == 1000:
        return classes.read_names(classes.IMAGENET_NAMES,
                                  1000, flag='the recipe\'s')
    return [f'class {i}' for i in range(args.num_classes)]


def predict(args, net, world, dali_images):
    """--mode pred: the top --topk classes of each image, with probabilities, printed and optionally saved
    as JSON. An unreadable image is reported and the others are still classified. `net` comes from
    inference_network (trained weights, INT8 if asked). Images are preprocessed as the run validates
    (val_interpolation): by DALI's validation graph (`dali_images(args)`: dali.py's PredictionImages, given by
    the composer), or as ImageRecordIter (load_image)."""
    names = class_names(args)
    results = []
    inputs = prediction_inputs(args.data_pred)
    # The run's validation preprocessing: DALI's graph for a run that validates with DALI, else ImageRecordIter's
    images = dali_images(args) if val_interpolation(args) == 'linear-antialias' else None
    log.info('Prediction with %s: %s', 'DALI (on the CPU)' if images else 'OpenCV', describe_val_resize(args))
    for path in inputs:
        try:
            image = (images.load(path) if images else load_image(path, args)).as_in_context(world.devices.contexts[0])
        except RecipeError as e:
            if len(inputs) > 1:   # one image alone: the error line at the end says it
                log.error('%s', e)
            results.append({'image': path, 'error': str(e)})
            continue
        probabilities = mx.nd.softmax(logits(args, net, image).astype('float32')).asnumpy()[0]
        top = np.argsort(-probabilities)[:args.topk]
        print(f'{path}:')
        for rank, index in enumerate(top, 1):
            print(f'{rank:>3}. {probabilities[index] * 100:6.2f}% -> {names[index]}')
        results.append({'image': path, 'top': [{'class': int(i), 'name': names[i],
                                                 'probability': float(probabilities[i])} for i in top]})
    if args.pred_output:
        files.write_json(args.pred_output, {'checkpoint': resume.find_weights(Workspace.of(args), args.load),
                                            'predictions': results})
    if all('error' in r for r in results):
        raise RecipeError(results[0]['error'] if len(results) == 1 else
                          f'none of the {len(results)} images of --data-pred {args.data_pred} could be read '
                          f'(the first: {results[0]["error"]})')
    return results


# ----------------------------------------------------------------------------------------------------------
# INT8


def int8_network(args, net, source, world, get_loaders):
    """The calibrated INT8 network: loaded from the workspace cache when it matches, else calibrated now
    (by rank 0; other workers wait for its files) and saved."""
    prefix = Workspace.of(args).int8_prefix
    wanted = calibration_record(args, net, source)
    if world.rank == 0 and cached_calibration(prefix) != wanted:
        if os.path.exists(prefix + '.json'):
            os.remove(prefix + '.json')             # it must not vouch for the files about to be replaced
        quantized, images = calibrate(args, net, get_loaders)
        export_block(quantized, prefix)
        files.write_json(prefix + '.json', dict(wanted, calib_images=images))   # last: it vouches for the files
        log.info('Saved the calibrated INT8 model as %s-symbol.json / -0000.params', prefix)
    world.comm.barrier()
    record = cached_calibration(prefix)
    if record != wanted:
        raise RecipeError(f'{prefix}.json does not describe this calibration (another run wrote it meanwhile?)')
    log.info('INT8 model: %s-symbol.json (%s calibration on %d training images)', prefix, args.calib_mode,
             record['calib_images'])
    try:
        block = mx.gluon.SymbolBlock.imports(prefix + '-symbol.json', ['data'], prefix + '-0000.params',
                                             ctx=world.devices.contexts[0])
    except (AssertionError, mx.base.MXNetError, ValueError) as e:
        raise RecipeError(f'the saved INT8 model {prefix}-symbol.json / -0000.params cannot be loaded '
                          f'({mxnet_message(e)[:200]}): delete {prefix}.json to calibrate again') from e
    block.hybridize(static_alloc=True, static_shape=True)
    return block


def calibration_record(args, net, source):
    """What an INT8 model depends on; a cached model is reused only when all of it matches. The graph's hash
    makes a change to models.py (a new operator, say) calibrate again even with the same weights."""
    graph = net(mx.sym.var('data')).tojson().encode()
    return {'weights': os.path.abspath(source) if source else None,
            'weights_sha256': files.file_sha256(source) if source else None,
            'graph_sha256': hashlib.sha256(graph).hexdigest(),
            'arch': args.arch, 'num_layers': args.num_layers, 'num_classes': args.num_classes,
            'image_shape': list(image_shape(args, training=False)), 'input_layout': args.input_layout,
            'calib_mode': args.calib_mode, 'calib_batches': args.calib_batches, 'calib_batch_size': CALIBRATION_BATCH,
            'data': args.data_train if args.data_backend != 'synthetic' else 'synthetic'}


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


def calibrate(args, net, get_loaders):
    """Quantize `net` with ranges measured on --calib-batches training batches of CALIBRATION_BATCH images,
    preprocessed as validation images are (no random crops: the ranges should be those the model meets at
    inference). Returns the quantized network and how many images calibrated it."""
    from mxnet.contrib import quantization
    calib_args = resolve.replaced(args, data_val=args.data_train, data_val_idx=args.data_train_idx,
                                  batch_size=CALIBRATION_BATCH)
    _, loader = get_loaders(calib_args, 0, 1, train=False, val=True)   # on the CPU: INT8's device
    count = min(args.calib_batches, loader.num_batches)
    images = [whole(batch.data[0]).copyto(mx.cpu()) for batch in batches(loader, 0, 0, count)]
    log.info('Calibrating INT8 ranges (%s) on %d batches of %d training images%s', args.calib_mode, count,
             loader.batch_size, '' if count == args.calib_batches else
             f' (the training set has only {count} batches, not --calib-batches {args.calib_batches})')
    calib_data = mx.io.NDArrayIter(data=mx.nd.concat(*images, dim=0), batch_size=loader.batch_size)
    quantized = quantization.quantize_net_v2(net, quantized_dtype='auto', calib_mode=args.calib_mode,
                                             calib_data=calib_data, num_calib_examples=count * loader.batch_size,
                                             ctx=mx.cpu(), logger=None)
    quantized(images[0])   # export() saves the parameters of the graph a forward pass has built (else none)
    return quantized, count * loader.batch_size


def input_shape(args, channels=None):
    """The (C, H, W) or (H, W, C) shape of one validation (and pred, export) image in --input-layout, with
    --image-shape's channels unless `channels` is given."""
    shape = image_shape(args, training=False)
    height, width = shape[1:]
    channels = channels or shape[0]
    return (height, width, channels) if args.input_layout == 'NHWC' else (channels, height, width)


def export_block(block, prefix):
    """block.export() to prefix-symbol.json and prefix-0000.params, each written under a temporary name and
    renamed, so a crash never leaves half a file."""
    temporary = f'{prefix}.partial'
    block.export(temporary, 0)
    for suffix in ('-symbol.json', '-0000.params'):
        os.replace(temporary + suffix, prefix + suffix)
