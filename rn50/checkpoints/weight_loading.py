"""Weights files of any origin, read and loaded into a network: this recipe's own `.params` and `.state`
(checkpoint.py writes them), the `.params` of NVIDIA's original recipe and GluonCV, and the foreign formats,
torchvision's and timm's `.safetensors` (the safetensors package's NumPy API, no PyTorch) and `.npz`;
weight_origins.py recognises what a file holds, weight_conversion.py converts it to the network's layout, stem
width and precision.

    arrays = weight_loading.read_arrays(path)                            # name -> numpy array, of any weights file
    weight_loading.load_weights(net, path, args.rgb_mean, args.rgb_std)  # any format, logged: what was recognised
    weight_loading.load_weights(net, path, mean, std, finetune=True)     # a classifier of another width stays fresh

--load, val, pred, INT8, export, fine-tuning and a --teacher read their weights here.
"""
import logging
import os
import zipfile

import mxnet as mx
import numpy as np

from rn50.checkpoints import checkpoint
from rn50.checkpoints import weight_conversion, weight_origins
from rn50.errors import RecipeError, mxnet_message

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = ('.params', '.safetensors', '.npz')


def read_arrays(path):
    """name -> numpy array of a weights file: `.params` (MXNet `save_parameters` / `mx.nd.save` dictionary),
    `.state` (this recipe's training state), `.safetensors` (the safetensors package's NumPy API, no
    PyTorch) or `.npz`. A missing, truncated or corrupt file, a file without parameter names, or another
    suffix is a RecipeError whose message names the file and the reason (never MXNet's traceback text)."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in WEIGHT_SUFFIXES + ('.state',):
        raise RecipeError(f'{path}: unknown weights format {suffix or "(no suffix)"!r}; expected one of '
                          f'{", ".join(WEIGHT_SUFFIXES + (".state",))} (a PyTorch .pth/.pt pickle needs PyTorch: '
                          'save it as .safetensors first)')
    if not os.path.isfile(path):
        raise RecipeError(f'weights file {path} does not exist')
    if suffix == '.state':
        return {name: value.asnumpy() for name, value in checkpoint.read_state(path).params.items()}
    reader = {'.params': read_params_file, '.safetensors': read_safetensors, '.npz': read_npz}[suffix]
    arrays = reader(path)
    if not arrays:
        raise RecipeError(f'{path} holds no arrays')
    return arrays


def read_params_file(path):
    try:
        loaded = mx.nd.load(path)
    except mx.base.MXNetError as e:
        raise RecipeError(f'{path} is not a readable MXNet parameter file (truncated or corrupt?): '
                          f'{mxnet_message(e)}') from None
    if not isinstance(loaded, dict):
        raise RecipeError(f'{path} holds a list of {len(loaded)} arrays without names, not a parameter '
                          'dictionary (save it with save_parameters or mx.nd.save of a dict)')
    return {name: value.asnumpy() for name, value in loaded.items()}


def read_safetensors(path):
    from safetensors.numpy import load_file
    try:
        return dict(load_file(path))
    except Exception as e:     # SafetensorError (header, truncation), TypeError/ValueError (dtypes)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if 'bf16' in reason.lower() or 'bfloat16' in reason.lower():
            raise RecipeError(f'{path} holds bfloat16 tensors, which NumPy (and so this reader) cannot represent: '
                              'save the weights as float32') from None
        raise RecipeError(f'{path} is not a readable .safetensors file (truncated or corrupt?): {reason}') from None


def read_npz(path):
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RecipeError(f'{path} is not a readable .npz archive of arrays (truncated or corrupt?): '
                          f'{reason}') from None


def load_weights(net, path, mean, std, finetune=False):
    """Weights of any format read_arrays reads and weight_origins.py recognises into `net`, converted to its
    layout, stem width and precision; one log line says what was recognised and converted, another which
    input normalisation the weights expect when it is not this run's (`mean`, `std`: --rgb-mean, --rgb-std).
    With `finetune`, a classifier of another width than the network's is left out, so the network's keeps its
    fresh initialisation."""
    arrays = read_arrays(path)
    origin = weight_origins.recognise(arrays)
    classes = net._collect_params_with_prefix()['output.weight'].shape[0]
    new_classifier = finetune and origin.num_classes not in (None, classes)
    params, description = weight_conversion.convert(arrays, net, new_classifier=new_classifier, source=path)
    checkpoint.load_params_into(net, params, checkpoint.network_contexts(net))
    log.info('Loaded %s', description)
    expected = weight_origins.normalisation(origin)
    if not (np.allclose(expected['mean'], mean) and np.allclose(expected['std'], std)):
        log.warning('These weights were trained with input mean %s and std %s, this run normalises with %s and '
                    '%s: for the same preprocessing pass %s', expected['mean'], expected['std'],
                    tuple(mean), tuple(std), expected['flags'])
