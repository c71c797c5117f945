"""--mode export: the trained network as MXNet symbol+params and ONNX, in the portable form (float32, NCHW,
3-channel stem, no NVIDIA fused kernels) whatever the run or checkpoint used.

    ./runner --mode export --dtype float32 ... --workspace runs/demo     # -> runs/demo/export/model.onnx

Export writes `<workspace>/export/<prefix>-symbol.json`, `<prefix>-0000.params` and `<prefix>.onnx` (float32,
any batch size, input named `data` in --input-layout), `<prefix>.preprocessing.json`, what the model expects
(the run's validation preprocessing: size, resize, interpolation, crop, mean, std, layout, channels; also in
report_export.json), and for a network torchvision builds too, `<prefix>.torchvision.safetensors`, the weights
under torchvision's names (torchvision_weights.py); with --triton DIR also a Triton model repository in DIR
(triton.py). All of them or none. The ONNX file keeps the weights as
initializers only (mx2onnx also lists them as graph inputs, which stops onnxruntime from folding them). When
onnxruntime is installed and --data-val is given, export checks that onnxruntime and MXNet agree on a batch of
validation images and logs the largest difference.
"""
import logging
import os

import mxnet as mx
import numpy as np

from rn50 import files
from rn50.checkpoints import weight_files
from rn50.checkpoints import resume
from rn50.checkpoints.workspace import Workspace
from rn50.data.contract import image_shape, whole
from rn50.data.validation_resize import val_interpolation
from rn50.errors import RecipeError, mxnet_message
from rn50.inference import torchvision_weights, triton
from rn50.inference.inference import class_names, input_shape
from rn50.nets import catalogue

log = logging.getLogger(__name__)


def export(args, world, get_loaders, build_network, serialize_preprocessing):
    """--mode export: symbol+params, ONNX and the torchvision weights of the trained weights in
    <workspace>/export (rank 0 only), as the portable network, and with --triton a Triton model repository whose
    preprocessing model `serialize_preprocessing(path, input_name, max_batch_size)` writes (the composer's
    dali.serialize_preprocessing). Every file is written under a temporary name and renamed only when all
    exist, so a failure leaves no partial export behind."""
    if args.quantize:
        raise RecipeError('--mode export writes the float32 network (ONNX has no MXNet INT8 operators); the INT8 '
                          f'model is saved by --mode val --quantize int8 as {args.model_prefix}_int8-symbol.json')
    names = class_names(args)        # a class-name file that names another number of classes is an error
    if args.triton:
        triton.check_folder(args.triton)
    source = resume.inference_weights(Workspace.of(args), args.load)
    net, shape = portable_network(args, build_network)
    weight_files.load_weights(net, source, args.rgb_mean, args.rgb_std)
    if world.rank != 0:
        return {}
    folder = Workspace.of(args).export_folder
    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, args.model_prefix)
    partial = os.path.join(folder, f'.{args.model_prefix}.partial')
    twin = catalogue.torchvision_twin(args.arch, args.num_layers, args.num_groups)
    files = {'-symbol.json': prefix + '-symbol.json', '-0000.params': prefix + '-0000.params',
             '.onnx': prefix + '.onnx', '.preprocessing.json': prefix + '.preprocessing.json'}
    if twin:
        files['.torchvision.safetensors'] = prefix + '.torchvision.safetensors'
    expects = preprocessing(args)
    try:
        net(mx.nd.zeros((1,) + shape))            # the hybridized graph exists after one call
        net.export(partial, 0)
        write_onnx(partial + '-symbol.json', partial + '-0000.params', shape, partial + '.onnx')
        files.write_json(partial + '.preprocessing.json', expects)
        if twin:
            torchvision_weights.write(partial + '.torchvision.safetensors', net, twin, args.num_classes,
                                      args.batchnorm_eps, args.batchnorm_mom)
        if args.triton:
            repository = triton.Repository(args.model_prefix, shape, tuple(names), args.batch_size)
            triton.write(args.triton, repository, partial + '.onnx', serialize_preprocessing)
        for suffix, path in files.items():
            os.replace(partial + suffix, path)
    except (RuntimeError, OSError, AttributeError, KeyError, mx.base.MXNetError) as e:   # DALI's: RuntimeError
        raise RecipeError(f'exporting {source} failed ({type(e).__name__}: {mxnet_message(e)[:200]}); nothing '
                          'was written') from e
    finally:
        for suffix in files:
            if os.path.exists(partial + suffix):
                os.remove(partial + suffix)
    log.info('Exported %s to %s', source, ', '.join(files.values()))
    log.info('The exported model expects: %s (%s)', '; '.join(expects['steps']), files['.preprocessing.json'])
    outputs = {'symbol': files['-symbol.json'], 'params': files['-0000.params'], 'onnx': files['.onnx'],
               'weights': source, 'preprocessing_file': files['.preprocessing.json'], 'preprocessing': expects,
               'torchvision': pytorch_summary(args, twin, files.get('.torchvision.safetensors')),
               'triton': os.path.abspath(args.triton) if args.triton else None}
    if args.triton:
        log.info('Triton model repository: %s (model %r: encoded images in, probabilities out)', args.triton,
                 args.model_prefix)
    if args.data_val or args.data_backend == 'synthetic':
        outputs['onnxruntime_max_difference'] = check_onnx(args, net, files['.onnx'], get_loaders)
    return outputs


def pytorch_summary(args, twin, path):
    """How PyTorch loads the torchvision weights at `path` (logged; for report_export.json), or None, said, for a
    network torchvision does not build."""
    if twin is None:
        log.info('No %s.torchvision.safetensors: torchvision builds no twin of --arch %s --num-layers %d (its '
                 'twins: %s)', args.model_prefix, args.arch, args.num_layers, catalogue.describe_twins())
        return None
    loading = torchvision_weights.how_to_load(twin, args.num_classes, args.batchnorm_eps, args.batchnorm_mom, path)
    log.info('PyTorch: %s.load_state_dict(safetensors.torch.load_file(%r)); timm: %s', loading['torchvision'], path,
             loading['timm'])
    return dict(loading, file=path)


def preprocessing(args):
    """What the exported model expects of an image, the run's validation preprocessing (data.py, dali.py): the
    machine-readable values the README's snippet reads, and the steps in words."""
    height, width = image_shape(args, training=False)[1:]
    interpolation = val_interpolation(args)
    filter_words = ('antialiased when shrinking (Pillow: image.resize(size, Image.BILINEAR))'
                    if interpolation == 'linear-antialias' else 'no antialiasing (OpenCV: cv2.resize(image, size, '
                    'interpolation=cv2.INTER_LINEAR); Pillow: image.transform(size, Image.AFFINE, (image.width / '
                    'size[0], 0, 0, 0, image.height / size[1], 0), Image.BILINEAR))')
    layout = 'N, 3, H, W' if args.input_layout == 'NCHW' else 'N, H, W, 3'
    return {'input_name': 'data', 'layout': args.input_layout, 'dtype': 'float32', 'channels': 'RGB',
            'size': [height, width], 'resize_shorter': args.data_val_resize, 'interpolation': interpolation,
            'mean': list(args.rgb_mean), 'std': list(args.rgb_std),
            'steps': ['decode as RGB (no EXIF rotation)',
                      f'resize the shorter side to {args.data_val_resize} and the longer to floor(longer * '
                      f'{args.data_val_resize} / shorter), linear interpolation, {filter_words}',
                      f'crop the centre {height}x{width} (H x W) at offsets floor((resized - crop) / 2)',
                      'normalise each channel: (pixel value 0-255 - mean) / std',
                      f'float32 tensor ({layout}) named data; output: logits (N, classes)']}


def portable_network(args, build_network):
    """(network, input shape) of what export writes (`build_network`: the composer's models.build for the CPU):
    the run's architecture in float32 with NCHW layers, 3 input channels and no fused kernels, on the CPU: what
    ONNX and every runtime take, whatever layouts, precision, stem width and kernels the weights were trained
    with (weight_files.load_weights converts them). The input stays in --input-layout; a 4th input channel,
    zeros in this recipe's data, is dropped."""
    options = dict(dtype='float32', conv_layout='NCHW', batchnorm_layout='NCHW',
                   pooling_layout='NCHW', fuse_bn_relu=False, fuse_bn_add_relu=False,
                   image_shape=(3,) + image_shape(args, training=False)[1:])
    net = build_network(**options)
    net.initialize(ctx=mx.cpu())
    net.hybridize(static_alloc=True, static_shape=True)
    return net, input_shape(args, channels=3)


def portable_images(images, args):
    """A batch of the run's input (any dtype, 3 or 4 channels) as the portable network takes it."""
    images = images.as_in_context(mx.cpu()).astype('float32')
    if args.image_shape[0] == 4:
        images = images[:, :, :, :3] if args.input_layout == 'NHWC' else images[:, :3]
    return images


def write_onnx(symbol_path, params_path, shape, onnx_path):
    """ONNX with a free batch dimension; weights stay initializers and are removed from the graph inputs."""
    import onnx
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)   # mx.onnx logs each step at INFO on the root logger: not the user's news
    try:
        mx.onnx.export_model(symbol_path, params_path, [(1,) + shape], [np.float32], onnx_path, dynamic=True,
                             dynamic_input_shapes=[(None,) + shape], verbose=False)
    finally:
        root.setLevel(level)
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
    _, loader = get_loaders(args, 0, 1, train=False, val=True)   # on the CPU, as the portable network
    batch = next(iter(loader.epoch(0)))
    images = whole(batch.data[0])
    real = len(images) - batch.pad        # a small set's only batch is padded with repeated images
    images = portable_images(images, args)[:real]
    session = onnxruntime.InferenceSession(onnx_path, providers=['CPUExecutionProvider'])
    onnx_logits = session.run(None, {session.get_inputs()[0].name: images.asnumpy()})[0]
    difference = float(np.abs(onnx_logits - net(images).asnumpy()).max())
    log.info('onnxruntime and MXNet agree within %.2g on %d validation images', difference, real)
    return difference
