"""Inference: the trained network made ready for `--mode val` and `--mode pred` (weights, INT8), and
`--mode export` (MXNet symbol+params and ONNX).

    ./runner --mode val --dtype float32 --data-root data/demo/rec ... --workspace runs/demo --quantize int8
    ./runner --mode pred --dtype float32 ... --workspace runs/demo --data-pred cat.jpg --quantize int8
    ./runner --mode export --dtype float32 ... --workspace runs/demo     # -> runs/demo/export/model.onnx

* Weights: `--load`, else the workspace's best checkpoint, else its last state (fit.find_weights); never
  random weights, except for a `--no-metrics` speed measurement without `--load`.
* `--quantize int8`: post-training quantization with MXNet's oneDNN INT8 kernels (CPU only). The network is
  calibrated on the first `--calib-batches` batches of the training set, preprocessed as for validation
  (`--calib-mode naive` takes the min/max of each layer's outputs, `entropy` the KL-optimal thresholds).
  The calibrated model is saved as `<prefix>_int8-symbol.json` / `-0000.params` in the workspace with a
  `<prefix>_int8.json` that records what it was calibrated from; a later run with the same weights, network
  graph and calibration settings loads it instead of calibrating again.
* float32 on the CPU: oneDNN's graph fusion (`fused_float32`), about 12% faster.
* `--amp` (bfloat16 on CPU, float16 on GPU): fit.resolve_hardware has switched AMP on before the network
  was built, so the same network runs in mixed precision; nothing more to do here.
* Export writes `<workspace>/export/<prefix>-symbol.json`, `<prefix>-0000.params` and `<prefix>.onnx`
  (float32, any batch size, input named `data` in --input-layout). The ONNX file keeps the weights as
  initializers only (mx2onnx also lists them as graph inputs, which stops onnxruntime from folding them).
  When onnxruntime is installed and --data-val is given, export checks that onnxruntime and MXNet agree on
  a batch of validation images and logs the largest difference.
"""
import copy
import hashlib
import json
import logging
import os

import mxnet as mx
import numpy as np

import logs
from errors import RecipeError

log = logging.getLogger(__name__)

CALIB_MODES = ('naive', 'entropy')


def add_inference_args(parser):
    group = parser.add_argument_group('Inference', 'val, pred and export modes')
    group.add_argument('--quantize', default=None, choices=['int8'],
                       help='val and pred modes: run the network in INT8 (oneDNN, CPU), calibrated once on the '
                            'training set and cached in the workspace')
    group.add_argument('--calib-batches', type=int, default=10,
                       help='--quantize: how many training batches (of --batch-size) calibrate the ranges')
    group.add_argument('--calib-mode', default='naive', choices=CALIB_MODES,
                       help='--quantize: naive (min/max of each layer output) or entropy (KL-divergence '
                            'thresholds; slower to calibrate)')
    return group


def check_inference_flags(args):
    """RecipeError for inference flags that cannot work with the mode or the machine."""
    if args.quantize is None:
        return
    if args.mode not in ('val', 'pred'):
        raise RecipeError(f'--quantize int8 is for --mode val and pred (INT8 inference), not --mode {args.mode}; '
                          'to deploy the INT8 model, run --mode val --quantize int8 and use the '
                          f'{args.model_prefix}_int8-symbol.json/-0000.params it saves')
    if args.device != 'cpu':
        raise RecipeError('--quantize int8 uses oneDNN INT8 kernels, which run on the CPU only: leave out --gpus '
                          'or run on a CPU machine')
    if args.amp or args.dtype != 'float32':
        raise RecipeError('--quantize int8 starts from the float32 network: leave out --amp and use '
                          '--dtype float32')
    if args.calib_batches < 1:
        raise RecipeError('--calib-batches must be at least 1')
    if args.data_backend != 'synthetic' and not args.data_train:
        raise RecipeError('--quantize int8 calibrates on the training set: pass --data-train (or --data-root '
                          'to the runner)')


def inference_network(args, net, world, get_loaders):
    """The network val and pred run: `net` with trained weights, or its INT8 version."""
    import fit
    if args.no_metrics and not args.load and args.mode == 'val':
        log.warning('--no-metrics: measuring validation speed; weights are random unless --load is given')
        source = None
    else:
        source = fit.find_weights(args)
        fit.load_weights(net, source, args.contexts)
    if args.quantize:
        return int8_network(args, net, source, world, get_loaders)
    return fused_float32(args, net)


def fused_float32(args, net):
    """`net` with oneDNN's graph fusion on a oneDNN CPU build in float32: each convolution with its batchnorm
    (folded into the weights), residual addition and ReLU becomes one operator. ResNet-50 ran 12% faster
    (same logits within 1e-5); it is for inference only, as the folded batchnorm no longer trains."""
    if args.device != 'cpu' or args.amp or args.dtype != 'float32' or \
            not mx.runtime.Features().is_enabled('MKLDNN'):
        return net
    example = mx.nd.zeros((1,) + input_shape(args), ctx=args.contexts[0])   # partitioning runs it once
    net.optimize_for(example, backend='MKLDNN', static_alloc=True, static_shape=True)
    log.info('float32 inference with oneDNN fusion (convolution + batchnorm + add + ReLU in one operator)')
    return net


# ----------------------------------------------------------------------------------------------------------
# INT8


def int8_network(args, net, source, world, get_loaders):
    """The calibrated INT8 network: loaded from the workspace cache when it matches, else calibrated now
    (by rank 0; other workers wait for its files) and saved."""
    prefix = os.path.join(args.workspace, f'{args.model_prefix}_int8')
    wanted = calibration_record(args, net, source)
    if world.rank == 0 and cached_calibration(prefix) != wanted:
        if os.path.exists(prefix + '.json'):
            os.remove(prefix + '.json')             # it must not vouch for the files about to be replaced
        export_block(calibrate(args, net, get_loaders), prefix)
        logs.write_json(prefix + '.json', wanted)   # written last: it vouches for the two files
        log.info('Saved the calibrated INT8 model as %s-symbol.json / -0000.params', prefix)
    world.barrier()
    if cached_calibration(prefix) != wanted:
        raise RecipeError(f'{prefix}.json does not describe this calibration (another run wrote it meanwhile?)')
    log.info('INT8 model: %s-symbol.json (%s calibration on %d batches)', prefix, args.calib_mode,
             args.calib_batches)
    try:
        block = mx.gluon.SymbolBlock.imports(prefix + '-symbol.json', ['data'], prefix + '-0000.params',
                                             ctx=args.contexts[0])
    except (AssertionError, mx.base.MXNetError, ValueError) as e:
        raise RecipeError(f'the saved INT8 model {prefix}-symbol.json / -0000.params cannot be loaded '
                          f'({str(e).splitlines()[0][:200]}): delete {prefix}.json to calibrate again') from e
    block.hybridize(static_alloc=True, static_shape=True)
    return block


def calibration_record(args, net, source):
    """What an INT8 model depends on; a cached model is reused only when all of it matches. The graph's hash
    makes a change to models.py (a new operator, say) calibrate again even with the same weights."""
    graph = net(mx.sym.var('data')).tojson().encode()
    return {'weights': os.path.abspath(source) if source else None,
            'weights_sha256': file_sha256(source) if source else None,
            'graph_sha256': hashlib.sha256(graph).hexdigest(),
            'arch': args.arch, 'num_layers': args.num_layers, 'num_classes': args.num_classes,
            'image_shape': list(args.image_shape), 'input_layout': args.input_layout,
            'calib_mode': args.calib_mode, 'calib_batches': args.calib_batches, 'batch_size': args.batch_size,
            'data': args.data_train if args.data_backend != 'synthetic' else 'synthetic'}


def cached_calibration(prefix):
    try:
        with open(prefix + '.json') as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    ready = all(os.path.exists(prefix + suffix) for suffix in ('-symbol.json', '-0000.params'))
    return record if ready else None


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def calibrate(args, net, get_loaders):
    """Quantize `net` with ranges measured on --calib-batches training batches, preprocessed as validation
    images are (no random crops: the ranges should be those the model meets at inference)."""
    from mxnet.contrib import quantization
    calib_args = copy.copy(args)
    calib_args.data_val, calib_args.data_val_idx = args.data_train, args.data_train_idx
    _, loader = get_loaders(calib_args, 0, 1, train=False, val=True)
    count = min(args.calib_batches, loader.num_batches)
    images = [batch.data[0].copyto(mx.cpu()) for batch in batches_of(loader, count)]
    log.info('Calibrating INT8 ranges (%s) on %d batches of %d training images', args.calib_mode, count,
             loader.batch_size)
    calib_data = mx.io.NDArrayIter(data=mx.nd.concat(*images, dim=0), batch_size=loader.batch_size)
    quantized = quantization.quantize_net_v2(net, quantized_dtype='auto', calib_mode=args.calib_mode,
                                             calib_data=calib_data, num_calib_examples=count * loader.batch_size,
                                             ctx=mx.cpu(), logger=None)
    quantized(images[0])   # export() saves the parameters of the graph a forward pass has built (else none)
    return quantized


def batches_of(loader, count):
    for index, batch in enumerate(loader.epoch(0)):
        if index == count:
            return
        yield batch


# ----------------------------------------------------------------------------------------------------------
# Export


def export(args, net, world, get_loaders):
    """--mode export: symbol+params and ONNX of the trained network in <workspace>/export (rank 0 only)."""
    import fit
    if args.quantize:
        raise RecipeError('--mode export writes the float32 network (ONNX has no MXNet INT8 operators); the INT8 '
                          f'model is saved by --mode val --quantize int8 as {args.model_prefix}_int8-symbol.json')
    source = fit.find_weights(args)
    fit.load_weights(net, source, args.contexts)
    if world.rank != 0:
        return {}
    net.cast('float32')
    folder = os.path.join(args.workspace, 'export')
    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, args.model_prefix)
    shape = input_shape(args)
    net(mx.nd.zeros((1,) + shape, ctx=args.contexts[0]))       # the hybridized graph exists after one call
    export_block(net, prefix)
    onnx_path = prefix + '.onnx'
    with logs.atomic_path(onnx_path) as path:
        write_onnx(prefix + '-symbol.json', prefix + '-0000.params', shape, path)
    log.info('Exported %s to %s-symbol.json, %s-0000.params and %s', source, prefix, prefix, onnx_path)
    outputs = {'symbol': prefix + '-symbol.json', 'params': prefix + '-0000.params', 'onnx': onnx_path,
               'weights': source}
    if args.data_val or args.data_backend == 'synthetic':
        outputs['onnxruntime_max_difference'] = check_onnx(args, net, onnx_path, get_loaders)
    return outputs


def export_block(block, prefix):
    """block.export() to prefix-symbol.json and prefix-0000.params, each written under a temporary name and
    renamed, so a crash never leaves half a file."""
    temporary = f'{prefix}.partial'
    block.export(temporary, 0)
    for suffix in ('-symbol.json', '-0000.params'):
        os.replace(temporary + suffix, prefix + suffix)


def input_shape(args):
    """The (C, H, W) or (H, W, C) shape of one input image in --input-layout."""
    channels, height, width = args.image_shape
    return (height, width, channels) if args.input_layout == 'NHWC' else (channels, height, width)


def write_onnx(symbol_path, params_path, shape, onnx_path):
    """ONNX with a free batch dimension; weights stay initializers and are removed from the graph inputs."""
    import onnx
    mx.onnx.export_model(symbol_path, params_path, [(1,) + shape], [np.float32], onnx_path, dynamic=True,
                         dynamic_input_shapes=[(None,) + shape], verbose=False)
    model = onnx.load(onnx_path)
    weights = {initializer.name for initializer in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    onnx.checker.check_model(model)
    onnx.save(model, onnx_path)


def check_onnx(args, net, onnx_path, get_loaders):
    """Largest |onnxruntime - MXNet| over the logits of one validation batch, or None without onnxruntime."""
    try:
        import onnxruntime
    except ImportError:
        log.info('onnxruntime is not installed: the ONNX model was checked by onnx.checker only')
        return None
    _, loader = get_loaders(args, 0, 1, train=False, val=True)
    images = next(iter(loader.epoch(0))).data[0].astype('float32')
    session = onnxruntime.InferenceSession(onnx_path, providers=['CPUExecutionProvider'])
    onnx_logits = session.run(None, {session.get_inputs()[0].name: images.asnumpy()})[0]
    difference = float(np.abs(onnx_logits - net(images.as_in_context(args.contexts[0])).asnumpy()).max())
    log.info('onnxruntime and MXNet agree within %.2g on %d validation images', difference, len(images))
    return difference
