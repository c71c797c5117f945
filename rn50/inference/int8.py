"""--quantize int8: post-training quantization with MXNet's oneDNN INT8 kernels (CPU only), for val and pred. The
network is calibrated on the first --calib-batches batches of CALIBRATION_BATCH training images, preprocessed as for
validation (--calib-mode naive takes the min/max of each layer's outputs, entropy the KL-optimal thresholds). The
calibrated model is saved as `<prefix>_int8-symbol.json` / `-0000.params` in the workspace with a `<prefix>_int8.json`
that records what it was calibrated from; a later run with the same weights, network graph and calibration
settings loads it instead of calibrating again.

    net = int8.int8_network(net, weights, world, int8.Calibration.of(args), workspace, dataset, loaders)
"""
import dataclasses
import hashlib
import json
import logging
import os

import mxnet as mx

from rn50 import files
from rn50.data.contract import batches, joined
from rn50.errors import RecipeError, mxnet_message
from rn50.nets.network import Network

log = logging.getLogger(__name__)

CALIB_MODES = ('naive', 'entropy')
# INT8 calibration reads batches of this size, not --batch-size: the ranges then depend on the calibration
# images alone, and val at any batch size and pred (one image at a time) share one calibrated model.
CALIBRATION_BATCH = 64


@dataclasses.dataclass(frozen=True)
class Calibration:
    """--quantize int8's calibration, as values (`of`): --calib-mode (`mode`), --calib-batches (`batches`), the
    network it quantizes (`network`, a nets.network.Network: the cached model records its architecture, depth and
    classes) and its data (`data`: the training .rec, or 'synthetic')."""
    mode: str = 'naive'
    batches: int = 10
    network: Network = Network()
    data: str = 'synthetic'

    @classmethod
    def of(cls, args):
        return cls(mode=args.calib_mode, batches=args.calib_batches, network=Network.of(args),
                   data=args.data_train if args.data_backend != 'synthetic' else 'synthetic')


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
            'arch': calibration.network.arch, 'num_layers': calibration.network.num_layers,
            'num_classes': calibration.network.num_classes,
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
    if calibration.mode == 'entropy' and quantization.stats is None:   # deferred by world/cpu.py's load_mxnet
        from scipy import stats
        quantization.stats = stats
    training_as_validation = dataclasses.replace(dataset, val=dataset.train, batch_size=CALIBRATION_BATCH)
    _, loader = loaders(training_as_validation, 0, 1, train=False, val=True)   # on the CPU: INT8's device
    count = min(calibration.batches, loader.num_batches)
    images = [joined(batch.data[0]).copyto(mx.cpu()) for batch in batches(loader, 0, 0, count)]
    log.info('Calibrating INT8 ranges (%s) on %d batches of %d training images%s', calibration.mode, count,
             loader.batch_size, '' if count == calibration.batches else
             f' (the training set has only {count} batches, not --calib-batches {calibration.batches})')
    calib_data = mx.io.NDArrayIter(data=mx.nd.concat(*images, dim=0), batch_size=loader.batch_size)
    quantized = quantization.quantize_net_v2(net, quantized_dtype='auto', calib_mode=calibration.mode,
                                             calib_data=calib_data, num_calib_examples=count * loader.batch_size,
                                             ctx=mx.cpu(), logger=None)
    quantized(images[0])   # export() saves the parameters of the graph a forward pass has built (else none)
    return quantized, count * loader.batch_size


def export_block(block, prefix):
    """block.export() to prefix-symbol.json and prefix-0000.params, each written under a temporary name and
    renamed, so a crash never leaves half a file."""
    temporary = f'{prefix}.partial'
    block.export(temporary, 0)
    for suffix in ('-symbol.json', '-0000.params'):
        os.replace(temporary + suffix, prefix + suffix)
