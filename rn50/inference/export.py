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
import dataclasses
import json
import logging
import os

import mxnet as mx
import numpy as np

from rn50.files import write_json
from rn50.checkpoints import weight_loading
from rn50.checkpoints import resume
from rn50.data import validation_resize
from rn50.data.contract import joined
from rn50.errors import RecipeError, mxnet_message
from rn50.inference import torchvision_weights, triton
from rn50.inference.evaluation import input_shape
from rn50.inference.prediction import class_names_of
from rn50.nets import catalogue

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Export:
    """--mode export's values (`of`): the files' `prefix` (--model-prefix), Triton's repository folder (`triton`)
    and its largest batch (`batch_size`), INT8 (`int8`: refused), the weights (`load`; else the workspace's), the
    class `names` (prediction.class_names_of: a class-name file naming another number of classes is an error
    there) and whether onnxruntime is checked on validation images (`check`: there are some)."""
    prefix: str = 'model'
    triton: str = None
    batch_size: int = 192
    int8: bool = False
    load: str = None
    names: tuple = ()
    check: bool = False

    @classmethod
    def of(cls, args):
        return cls(prefix=args.model_prefix, triton=args.triton, batch_size=args.batch_size, int8=bool(args.quantize),
                   load=args.load, names=tuple(class_names_of(args)),
                   check=bool(args.data_val or args.data_backend == 'synthetic'))


def export(settings, network, world, workspace, dataset, loaders, build_network, serialize_preprocessing):
    """--mode export (`settings`, an Export) of the run's `network` (a nets.network.Network; `build_network`: the
    composer's models.build on the CPU, which builds its portable form): symbol+params, ONNX and the torchvision
    weights of the trained weights in the `workspace`'s export/ (rank 0 only), and with --triton a Triton model
    repository whose preprocessing model `serialize_preprocessing(path, input_name, max_batch_size)` writes (the
    composer's dali.serialize_preprocessing). `dataset`: the run's contract.Dataset (its Images; its validation
    images, read through `loaders`, check onnxruntime). Every file is written under a temporary name and renamed
    only when all exist, so a failure leaves no partial export behind."""
    if settings.int8:
        raise RecipeError('--mode export writes the float32 network (ONNX has no MXNet INT8 operators); the INT8 '
                          f'model is saved by --mode val --quantize int8 as {settings.prefix}_int8-symbol.json')
    names = settings.names
    if settings.triton:
        triton.check_folder(settings.triton)
    source = resume.inference_weights(workspace, settings.load)
    images = dataset.images
    net, shape = portable_network(network, images, build_network)
    weight_loading.load_weights(net, source, images.mean, images.std)
    if world.rank != 0:
        return {}
    # Everything that can fail for want of a file is read before anything is written: the check's images.
    check_images = validation_images(dataset, loaders) if settings.check else None
    if check_images is None:
        log.info('No validation data: the ONNX model is checked by onnx.checker alone (give --data-root, or '
                 '--data-val, to compare onnxruntime with MXNet on validation images)')
    folder = workspace.export_folder
    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, settings.prefix)
    partial = os.path.join(folder, f'.{settings.prefix}.partial')
    twin = catalogue.torchvision_twin(network.arch, network.num_layers, network.num_groups)
    files = {'-symbol.json': prefix + '-symbol.json', '-0000.params': prefix + '-0000.params',
             '.onnx': prefix + '.onnx', '.preprocessing.json': prefix + '.preprocessing.json'}
    if twin:
        files['.torchvision.safetensors'] = prefix + '.torchvision.safetensors'
    expects = preprocessing(images)
    replaced = earlier_export_of_another_size(files['.preprocessing.json'], expects)
    try:
        net(mx.nd.zeros((1,) + shape))            # the hybridized graph exists after one call
        net.export(partial, 0)
        write_onnx(partial + '-symbol.json', partial + '-0000.params', shape, partial + '.onnx')
        write_json(partial + '.preprocessing.json', expects)
        if twin:
            torchvision_weights.write(partial + '.torchvision.safetensors', net, twin, network)
        if settings.triton:
            repository = triton.Repository(settings.prefix, shape, tuple(names), settings.batch_size)
            triton.write(settings.triton, repository, partial + '.onnx', serialize_preprocessing)
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
    tensorrt = trtexec_command(files['.onnx'], shape, settings.batch_size)
    log.info('A TensorRT engine of it for batches up to %d (on a GPU node, TensorRT\'s trtexec): %s',
             settings.batch_size, tensorrt)
    outputs = {'symbol': files['-symbol.json'], 'params': files['-0000.params'], 'onnx': files['.onnx'],
               'weights': source, 'trained': resume.describe_weights(source).record(),
               'preprocessing_file': files['.preprocessing.json'], 'preprocessing': expects,
               'torchvision': pytorch_summary(settings.prefix, network, twin, files.get('.torchvision.safetensors')),
               'triton': os.path.abspath(settings.triton) if settings.triton else None, 'tensorrt': tensorrt,
               'replaced': replaced}
    if settings.triton:
        log.info('Triton model repository: %s (model %r: encoded images in, probabilities out)', settings.triton,
                 settings.prefix)
    if check_images is not None:
        outputs['onnxruntime_max_difference'] = check_onnx(net, files['.onnx'], check_images)
    return outputs


def earlier_export_of_another_size(preprocessing_file, expects):
    """What an earlier export in the same folder was made for when it differs from this one (`expects`: this
    one's preprocessing): its size and resize, said in a warning, since its files are about to be replaced
    (export again with another --workspace to keep both). None for a first export or the same model's."""
    try:
        with open(preprocessing_file) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return None
    keys = ('size', 'resize_shorter', 'interpolation', 'layout')
    if all(earlier.get(key) == expects[key] for key in keys):
        return None
    before = {key: earlier.get(key) for key in keys}
    log.warning('Replacing the export in %s made for %s (resize %s, %s) by this one for %s (resize %d, %s): export '
                'with another --workspace to keep both', os.path.dirname(preprocessing_file),
                'x'.join(map(str, before['size'] or [])), before['resize_shorter'], before['interpolation'],
                'x'.join(map(str, expects['size'])), expects['resize_shorter'], expects['interpolation'])
    return before


def trtexec_command(onnx_path, shape, max_batch):
    """The trtexec command that builds a float16 TensorRT engine of the exported ONNX model for batches of 1 to
    `max_batch` (--batch-size, the Triton repository's max_batch_size) of its input `shape` (one image, in the
    input layout), the engine beside it (model.plan)."""
    dims = 'x'.join(map(str, shape))
    plan = os.path.splitext(onnx_path)[0] + '.plan'
    return (f'trtexec --onnx={onnx_path} --saveEngine={plan} --fp16 --minShapes=data:1x{dims} '
            f'--optShapes=data:{max_batch}x{dims} --maxShapes=data:{max_batch}x{dims}')


def pytorch_summary(prefix, network, twin, path):
    """How PyTorch loads the torchvision weights at `path` (logged; for report_export.json), or None, said, for a
    `network` torchvision does not build (`prefix`: --model-prefix)."""
    if twin is None:
        log.info('No %s.torchvision.safetensors: torchvision builds no twin of --arch %s --num-layers %d (its '
                 'twins: %s)', prefix, network.arch, network.num_layers, catalogue.describe_twins())
        return None
    loading = torchvision_weights.how_to_load(twin, network, path)
    log.info('PyTorch: %s.load_state_dict(safetensors.torch.load_file(%r)); timm: %s', loading['torchvision'], path,
             loading['timm'])
    return dict(loading, file=path)


def preprocessing(images):
    """What the exported model expects of an image, the run's validation preprocessing (`images`, its
    contract.Images; data.py, dali.py): the machine-readable values the README's snippet reads, and the steps in
    words."""
    height, width = images.shape_of(training=False)[1:]
    layout = 'N, 3, H, W' if images.layout == 'NCHW' else 'N, H, W, 3'
    return {'input_name': 'data', 'layout': images.layout, 'dtype': 'float32', 'channels': 'RGB',
            'size': [height, width], 'resize_shorter': images.val_resize, 'interpolation': images.val_interpolation,
            'mean': list(images.mean), 'std': list(images.std),
            'steps': ['decode as RGB (no EXIF rotation)'] + validation_resize.geometry_steps(images) + [
                'normalise each channel: (pixel value 0-255 - mean) / std',
                f'float32 tensor ({layout}) named data; output: logits (N, classes)']}


def portable_network(network, images, build_network):
    """(network, input shape) of what export writes of the run's `network` (a nets.network.Network;
    `build_network`: the composer's models.build for the CPU): its architecture in float32 with NCHW layers,
    3 input channels and no fused kernels, on the CPU: what ONNX and every runtime take, whatever layouts,
    precision, stem width and kernels the weights were trained with (weight_loading.load_weights converts them).
    The input stays in --input-layout; a 4th input channel, zeros in this recipe's data, is dropped. `images`:
    the run's contract.Images."""
    portable = dataclasses.replace(network, dtype='float32', conv_layout='NCHW', batchnorm_layout='NCHW',
                                   pooling_layout='NCHW', fuse_bn_relu=False, fuse_bn_add_relu=False,
                                   image_shape=(3,) + images.shape_of(training=False)[1:])
    net = build_network(portable)
    net.initialize(ctx=mx.cpu())
    net.hybridize(static_alloc=True, static_shape=True)
    return net, input_shape(images, channels=3)


def portable_images(images, spec):
    """A batch of the run's input (any dtype, 3 or 4 channels; `spec`: its contract.Images) as the portable network
    takes it."""
    images = images.as_in_context(mx.cpu()).astype('float32')
    if spec.shape[0] == 4:
        images = images[:, :, :, :3] if spec.layout == 'NHWC' else images[:, :3]
    return images


def write_onnx(symbol_path, params_path, shape, onnx_path):
    """ONNX with a free batch dimension; weights stay initializers and are removed from the graph inputs.

    mx2onnx is given the graph alone, every weight as an input of its shape (with the weights themselves it builds
    each initializer from a Python list of its values, a third of a microsecond a value: 9 s of ResNet-50's
    export); the initializers are then made from the arrays (numpy_helper), in the same order, with the same
    values: the nodes, inputs and outputs are those mx2onnx writes given the weights (tests/test_inference.py)."""
    import onnx
    from onnx import numpy_helper
    graph = mx.sym.load(symbol_path)
    weights = {name.split(':', 1)[1]: array.asnumpy() for name, array in mx.nd.load(params_path).items()}
    names = graph.list_inputs()
    if [name for name in names if name not in weights] != ['data']:
        raise RecipeError(f'export: the network\'s inputs {names} are not its image "data" and its weights')
    shapes = [weights[name].shape if name in weights else (1,) + shape for name in names]
    free_batch = [weights[name].shape if name in weights else (None,) + shape for name in names]
    types = [weights[name].dtype if name in weights else np.float32 for name in names]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)   # mx.onnx logs each step at INFO on the root logger: not the user's news
    try:
        mx.onnx.export_model(graph, {}, shapes, types, onnx_path, dynamic=True, dynamic_input_shapes=free_batch,
                             verbose=False)
    finally:
        root.setLevel(level)
    model = onnx.load(onnx_path)
    model.graph.initializer.extend(numpy_helper.from_array(weights[name], name) for name in names if name in weights)
    inputs = [value for value in model.graph.input if value.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    onnx.checker.check_model(model)
    onnx.save(model, onnx_path)


def validation_images(dataset, loaders):
    """One validation batch of `dataset` (read through `loaders`) as the portable network takes it, padding left
    out: what check_onnx runs through both. RecipeError when the data cannot be read."""
    _, loader = loaders(dataset, 0, 1, train=False, val=True)   # on the CPU, as the portable network
    batch = next(iter(loader.epoch(0)))
    images = joined(batch.data[0])
    real = len(images) - batch.pad        # a small set's only batch is padded with repeated images
    return portable_images(images, dataset.images)[:real]


def check_onnx(net, onnx_path, images):
    """Largest |onnxruntime - MXNet| over the logits of the validation `images` (validation_images), or None
    without onnxruntime."""
    try:
        import onnxruntime
    except ImportError:
        log.info('onnxruntime is not installed: the ONNX model was checked by onnx.checker only')
        return None
    real = len(images)
    session = onnxruntime.InferenceSession(onnx_path, providers=['CPUExecutionProvider'])
    onnx_logits = session.run(None, {session.get_inputs()[0].name: images.asnumpy()})[0]
    difference = float(np.abs(onnx_logits - net(images).asnumpy()).max())
    log.info('onnxruntime and MXNet agree within %.2g on %d validation images', difference, real)
    return difference
