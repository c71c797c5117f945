"""Will the batch fit? What a training or validation batch needs in memory, estimated before anything is
allocated, against what the devices have: a batch that cannot fit is one `error:` line with both figures,
instead of the kernel's out-of-memory killer ending the run without a word (CPU) or an allocation failure
inside the first step (GPU).

    memory.check_batch_fits(net, world, batch_size, images, dtype, mode)   # train.py: after the network is built,
                                                                           # before any weight or batch
    memory.check_batch_against_data(loader, world)   # --mode val: a warning when most of a batch is padding

The estimate, per device: batch images x bytes per image + the parameters' bytes (BYTES_PER_PARAMETER: in
training the weights, gradients and momentum, and in float16 the float32 master weights and the copies of an
undoable update too; the weights alone for validation). Bytes per image are a calibrated fraction of the bytes of every operator output
of the network for one image, read from the network's own graph at the run's image shape, so the figure
follows the architecture, depth, image area and dtype. What the loaders hold (a few decoded batches) is left
out: the estimate is what the network alone needs, so only a batch that certainly cannot fit is refused.

Calibration (AMD EPYC, 2 cores, MXNet 1.9.1 CPU build, float32, ResNet-50, synthetic data; `python train.py
--data-backend synthetic --num-classes 10 --benchmark-iters 2 --image-shape 3,S,S --batch-size B --mode M`, the
peak RSS its last log line reports): training at 3,64,64 peaked at 1031 MB with B=8 and 1478 MB with B=64,
7.98 MB per image where the graph's operator outputs are 11.71 MB per image (0.68); at 3,32,32, 992 MB with
B=8 and 1215 MB with B=128, 1.86 MB per image against 2.94 MB (0.63). MXNet's memory planning shares and frees
buffers, hence the fractions; TRAINING_FRACTION is a little below both, so a batch that would just fit is not
refused. Validation (`--mode val --no-metrics`, 3,64,64) peaked at 536 MB with B=8 and 609 MB with B=128:
0.61 MB per image, 0.052 of the outputs (no activation is kept for a backward pass). float16 is assumed to
halve the bytes (not measured: no GPU here).

Available memory: the host's (psutil), shared by the node's workers; a GPU's free memory from
mx.context.gpu_memory_info for each GPU of this worker, and no check where MXNet cannot tell it.
"""
import logging
import math

import mxnet as mx

from rn50.errors import RecipeError

log = logging.getLogger(__name__)

TRAINING_FRACTION = 0.6
VALIDATION_FRACTION = 0.05
GB = 1024 ** 3
# Bytes per parameter, by mode and dtype. Training in float32: weights, gradients, momentum. In float16 (GPUs):
# float16 weights and gradients, float32 master weights and momentum, and the device copies of the weights,
# master weights and momentum that an undoable update keeps (rn50/training/step.py's UpdateUndo).
BYTES_PER_PARAMETER = {('training', 'float32'): 3 * 4, ('training', 'float16'): 2 + 2 + 4 + 4 + (2 + 4 + 4),
                       ('inference', 'float32'): 4, ('inference', 'float16'): 2}


def graph_bytes(net, image_shape, input_layout, dtype):
    """(bytes of every operator output for one image, number of parameters) of `net`, from its graph's shapes at
    `image_shape` (nothing is allocated; the network need not be initialised)."""
    channels, height, width = image_shape
    shape = (1, channels, height, width) if input_layout == 'NCHW' else (1, height, width, channels)
    internals = net(mx.sym.var('data')).get_internals()
    arg_shapes, out_shapes, aux_shapes = internals.infer_shape(data=shape)
    outputs = sum(math.prod(s) for name, s in zip(internals.list_outputs(), out_shapes) if name.endswith('_output'))
    parameters = sum(math.prod(s) for name, s in zip(internals.list_arguments(), arg_shapes) if name != 'data')
    parameters += sum(math.prod(s) for s in aux_shapes)
    return outputs * (2 if dtype == 'float16' else 4), parameters


def batch_need(net, count, images, dtype, training):
    """(estimated bytes one device needs for a batch of `count` images, bytes per image), `training` or not, the
    images as `images` (contract.Images: shapes, layout) says, the network in `dtype` (--dtype)."""
    outputs, parameters = graph_bytes(net, images.shape_of(training), images.layout, dtype)
    per_image = outputs * (TRAINING_FRACTION if training else VALIDATION_FRACTION)
    kept = BYTES_PER_PARAMETER['training' if training else 'inference', dtype]
    return count * per_image + parameters * kept, per_image


def host_available():
    import psutil
    return psutil.virtual_memory().available


def gpu_free(context):
    """Free bytes of a GPU context, or None where MXNet cannot tell."""
    try:
        free, _ = mx.context.gpu_memory_info(context.device_id)
        return free
    except (mx.base.MXNetError, AttributeError, OSError):
        return None


def check_batch_fits(net, world, batch_size, images, dtype, mode, test_io=False):
    """RecipeError when this worker's share of the global `batch_size` cannot fit in its devices' memory
    (world.devices), the images as `images` (contract.Images) says, the network in `dtype`: for training and
    validation (`mode`: --mode; pred and export take a handful of images, `test_io` no network)."""
    if mode not in ('train', 'train_val', 'val') or test_io:
        return
    contexts = world.devices.contexts
    per_worker = max(1, batch_size // world.size)
    per_device = math.ceil(per_worker / len(contexts))
    need, per_image = batch_need(net, per_device, images, dtype, mode in ('train', 'train_val'))
    shape = images.shape_of(training=mode != 'val')
    what = (f'--batch-size {batch_size} ({per_device} images per device, {"x".join(map(str, shape))} '
            f'{dtype}, {"training" if mode != "val" else "validation"})')
    if world.devices.kind == 'gpu':
        for context in contexts:
            free = gpu_free(context)
            if free is not None and need > free:
                raise RecipeError(f'{what} needs about {need / GB:.1f} GB on GPU {context.device_id}, which has '
                                  f'{free / GB:.1f} GB free: lower the batch size (about '
                                  f'{fitting(free, need, per_image, per_device)} images per device would fit)')
        return
    local_workers = world.local_size
    available = host_available()
    total = need * len(contexts) * local_workers
    if total > available:
        workers = f' x {local_workers} workers on this node' if local_workers > 1 else ''
        raise RecipeError(f'{what} needs about {total / GB:.1f} GB of memory{workers}, and this machine has '
                          f'{available / GB:.1f} GB available: lower the batch size (about '
                          f'{fitting(available / (len(contexts) * local_workers), need, per_image, per_device)}'
                          ' images per device would fit)')


def fitting(available, need, per_image, images):
    """How many images per device the estimate lets into `available` bytes."""
    fixed = need - per_image * images
    return max(0, int((available - fixed) // per_image))


def check_batch_against_data(loader, world, what='validation'):
    """A warning when the global batch is far larger than the data set: most of each batch is padding (the
    images/s count real images only, so they fall with it), e.g. -b 192 on 32 validation images."""
    batch = loader.batch_size * world.size
    if batch >= 2 * loader.num_examples:
        log.warning('The global batch (%d) is far larger than the %d %s images: %d%% of it is padding; a batch of '
                    'about %d would do', batch, loader.num_examples, what,
                    round(100 * (1 - loader.num_examples / batch)), loader.num_examples)
