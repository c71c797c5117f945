"""The checks of export's serving outputs that need a GPU node's software, which scripts/gpu_check.py runs, and the
INT8 calibration cache for TensorRT:

    python scripts/gpu_check.py --only float16,tensorrt,triton
    TRITON_REPOSITORY=/srv/models python scripts/gpu_check.py --only float16,triton
    python scripts/gpu_check_export.py calibrate REPOSITORY --data-root data/photos   # -> <name>_network/calibration.cache

Both checks export the float16 check's checkpoint (`--mode export --triton`, with the digits' class names) and
read the digits' validation images:

    tensorrt   TensorRT (its Python package: `pip install tensorrt`, or NVIDIA's containers) builds a float16 plan
               from the repository's ONNX network and runs it on the validation images, preprocessed by the
               repository's own serialized DALI pipeline (on the CPU); its probabilities and top classes are
               compared with MXNet's, the exported symbol's on the same inputs, and both top-1s reported. Without
               TensorRT, or without a GPU: SKIP.
    triton     a Triton server at TRITON_URL (gRPC, default localhost:8001) that reads its models from
               TRITON_REPOSITORY in explicit model-control mode (`tritonserver --model-repository=$TRITON_REPOSITORY
               --model-control-mode=explicit`: the README's docker command with that flag): the check copies the
               repository's models there under the name gpu_check, loads them, sends the validation images as the
               repository's request (each file's bytes, zero-padded to one length) and compares the answer with
               --mode pred's probabilities of the same weights. Without TRITON_REPOSITORY, or no server: SKIP.

With --device cpu they start from a float32 checkpoint: tensorrt skips (TensorRT runs on GPUs); triton asks a
server where there is one (Triton serves on CPUs too), else runs its twin, the repository's two models run here
(DALI's deserialized pipeline on the CPU, onnxruntime) against pred. The parts that need neither a GPU nor a
server (the request, the models run here, the comparison, the calibration batches) are
tests/test_gpu_check_export.py's.
"""
import argparse
import json
import os
import shutil
import sys

import bootstrap
if __name__ == '__main__':
    bootstrap.start()   # the calibration tool: the project's Python, before any third-party import
import numpy as np  # noqa: E402

from gpu_check_training import SMALL, digits_dataset, last_error, run, runner  # noqa: E402

NAME = 'gpu_check'          # the repository's models: gpu_check, gpu_check_preprocessing, gpu_check_network
CLEAR = 0.05                 # a top class that leads by more than this must be the same in both answers
SAME_PROBABILITIES = 0.01    # GPU kernels against pred's (TF32 tensor cores of Ampere and later, float16 plans)


# ----------------------------------------------------------------------------------------------------------
# What runs anywhere: the repository's models here, the request, the comparison, calibration batches


def pad_batch(encoded):
    """One uint8 array (images, longest) of the files' bytes, zero-padded: Triton takes a request's batch in one
    shape; the decoders stop at the image's end and never read the padding."""
    longest = max(len(e) for e in encoded)
    return np.stack([np.pad(e, (0, longest - len(e))) for e in encoded])


def request(paths):
    """The repository's request for the images at `paths`: (inputs, outputs) of tritonclient.grpc."""
    from tritonclient import grpc
    batch = pad_batch([np.fromfile(path, np.uint8) for path in paths])
    image = grpc.InferInput('image', list(batch.shape), 'UINT8')
    image.set_data_from_numpy(batch)
    return [image], [grpc.InferRequestedOutput('probabilities')]


def preprocessing(folder, name):
    """The repository's serialized DALI pipeline (`folder`/`name`_preprocessing), deserialized to run on the CPU
    as Triton's DALI backend runs it, and its batch size."""
    from nvidia.dali import Pipeline, types
    from tritonclient.grpc import model_config_pb2
    from google.protobuf import text_format
    with open(os.path.join(folder, f'{name}_preprocessing', 'config.pbtxt')) as f:
        batch = text_format.Parse(f.read(), model_config_pb2.ModelConfig()).max_batch_size
    pipe = Pipeline.deserialize(filename=os.path.join(folder, f'{name}_preprocessing', '1', 'model.dali'),
                                batch_size=batch, num_threads=2, device_id=types.CPU_ONLY_DEVICE_ID,
                                exec_pipelined=False, exec_async=False, prefetch_queue_depth=1)
    pipe.build()
    return pipe, batch


def preprocessed(folder, name, encoded):
    """The network's inputs (float32 batches) of the encoded images `encoded` (uint8 arrays), by the repository's
    own DALI pipeline, in batches of its max_batch_size."""
    pipe, batch = preprocessing(folder, name)
    for start in range(0, len(encoded), batch):
        pipe.feed_input('image', list(pad_batch(encoded[start:start + batch])))
        (images,) = pipe.run()
        yield np.asarray(images.as_tensor())


def answer_here(folder, name, encoded):
    """What the repository answers for the encoded images `encoded` (uint8 arrays), computed here: its DALI
    pipeline on the CPU, then onnxruntime on its network (probabilities, one row per image)."""
    import onnxruntime
    session = onnxruntime.InferenceSession(os.path.join(folder, f'{name}_network', '1', 'model.onnx'),
                                           providers=['CPUExecutionProvider'])
    return np.concatenate([session.run(None, {'data': images})[0] for images in preprocessed(folder, name, encoded)])


def compare(answer, expected, tolerance, what):
    """(passed, detail): the probabilities `answer` against `expected` (rows of images): within `tolerance`, and the
    same top class wherever the expected one leads by more than CLEAR."""
    answer, expected = np.asarray(answer, np.float64), np.asarray(expected, np.float64)
    if answer.shape != expected.shape:
        return False, f'{what}: {answer.shape} probabilities for {expected.shape}'
    difference = float(np.abs(answer - expected).max())
    ranked = np.sort(expected, axis=1)
    clear = ranked[:, -1] - ranked[:, -2] > CLEAR
    flipped = int((answer.argmax(1) != expected.argmax(1))[clear].sum())
    passed = difference <= tolerance and flipped == 0
    return passed, f'{what}: {len(answer)} images, largest probability difference {difference:.2g} (allowed ' \
                   f'{tolerance:g}), top class different on {flipped} of the {int(clear.sum())} clear ones'


def records(rec_path, count):
    """(encoded images, labels) of the first `count` records of a RecordIO file."""
    import mxnet as mx
    reader = mx.recordio.MXRecordIO(rec_path, 'r')
    encoded, labels = [], []
    while len(encoded) < count and (record := reader.read()) is not None:
        header, payload = mx.recordio.unpack(record)
        encoded.append(np.frombuffer(payload, np.uint8))
        labels.append(int(np.ravel(header.label)[0]))
    reader.close()
    return encoded, np.array(labels)


# ----------------------------------------------------------------------------------------------------------
# TensorRT (GPU only)


def tensorrt_plan(onnx_path, batch, int8_batches=None, cache=None):
    """A serialized TensorRT engine of the ONNX network, float16 (and INT8 with `int8_batches`, calibrated by
    TensorRT's entropy calibrator, its cache written to `cache`), for batches of 1 to `batch`."""
    import tensorrt as trt
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    explicit_batch = int(trt.__version__.split('.')[0]) < 10      # TensorRT 10's networks always are
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH) if explicit_batch else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    with open(onnx_path, 'rb') as f:
        if not parser.parse(f.read()):
            raise RuntimeError(f'TensorRT cannot parse {onnx_path}: {parser.get_error(0)}')
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.FP16)
    shape = tuple(network.get_input(0).shape)[1:]
    profile = builder.create_optimization_profile()
    profile.set_shape('data', (1,) + shape, (batch,) + shape, (batch,) + shape)
    config.add_optimization_profile(profile)
    if int8_batches is not None:
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = calibrator(trt, int8_batches, cache)
        config.set_calibration_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f'TensorRT could not build a plan of {onnx_path} (its log above says why)')
    return plan


def calibrator(trt, batches, cache):
    """TensorRT's entropy calibrator fed `batches` (float32 arrays) through MXNet's GPU memory; the cache it
    writes is what `trtexec --int8 --calib=` reads."""
    import mxnet as mx

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            super().__init__()
            self.batches, self.current = iter(batches), None

        def get_batch_size(self):
            return 1

        def get_batch(self, names):
            batch = next(self.batches, None)
            if batch is None:
                return None
            self.current = mx.nd.array(batch, ctx=mx.gpu(0))
            mx.nd.waitall()
            return [device_pointer(self.current)]

        def read_calibration_cache(self):
            return None

        def write_calibration_cache(self, data):
            with open(cache, 'wb') as f:
                f.write(bytes(data))
    return Calibrator()


def device_pointer(array):
    """The address of an NDArray's memory (on the GPU for a GPU array)."""
    import ctypes
    import mxnet as mx
    pointer = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    return pointer.value


def run_plan(plan, batches, classes):
    """The engine's outputs (probabilities) on `batches`, through MXNet's GPU arrays; execute_v2 returns when the
    engine has finished."""
    import mxnet as mx
    import tensorrt as trt
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan)
    context = engine.create_execution_context()
    outputs = []
    for batch in batches:
        inputs = mx.nd.array(batch, ctx=mx.gpu(0))
        result = mx.nd.empty((len(batch), classes), ctx=mx.gpu(0))
        mx.nd.waitall()
        context.set_input_shape('data', batch.shape)
        context.execute_v2([device_pointer(inputs), device_pointer(result)])
        outputs.append(result.asnumpy())
    return np.concatenate(outputs)


def mxnet_probabilities(prefix, batches):
    """The probabilities of the MXNet symbol export wrote (`prefix`-symbol.json, -0000.params) on `batches`, on
    the first GPU."""
    import mxnet as mx
    block = mx.gluon.SymbolBlock.imports(prefix + '-symbol.json', ['data'], prefix + '-0000.params', ctx=mx.gpu(0))
    return np.concatenate([mx.nd.softmax(block(mx.nd.array(batch, ctx=mx.gpu(0)))).asnumpy() for batch in batches])


def check_tensorrt(options, workdir):
    try:
        import tensorrt
    except ImportError:
        return None, ('TensorRT is not installed (pip install tensorrt, or run in NVIDIA\'s TensorRT or Triton '
                      'container)')
    if options.device == 'cpu':
        return None, 'TensorRT runs on GPUs'
    folder, failure = exported(options, workdir)
    if failure:
        return failure
    encoded, labels = records(os.path.join(digits_dataset(workdir), 'val.rec'), 10 ** 6)
    batches = list(preprocessed(folder, NAME, encoded))
    network = os.path.join(folder, f'{NAME}_network', '1', 'model.onnx')
    batch = max(len(b) for b in batches)
    served = run_plan(tensorrt_plan(network, batch), batches, 10)
    reference = mxnet_probabilities(os.path.join(workdir, 'export-triton', 'export', NAME), batches)
    passed, detail = compare(served, reference, SAME_PROBABILITIES, f'TensorRT {tensorrt.__version__} float16 '
                                                                     'against MXNet float32')
    top1 = ', '.join(f'{what} {float((answer.argmax(1) == labels).mean()):.4f}'
                     for what, answer in (('TensorRT', served), ('MXNet', reference)))
    return passed, f'{detail}; top-1 {top1}'


# ----------------------------------------------------------------------------------------------------------
# Triton


def check_triton(options, workdir):
    """The repository's answer from a Triton server against --mode pred's; without a server, SKIP on GPUs, and on
    the CPU the twin: the repository's models run here (answer_here)."""
    url, repository = os.environ.get('TRITON_URL', 'localhost:8001'), os.environ.get('TRITON_REPOSITORY')
    client, reason = triton_client(url, repository)
    if client is None and options.device == 'gpu':
        return None, reason
    folder, failure = exported(options, workdir)
    if failure:
        return failure
    images, paths = validation_images(workdir)
    expected, failure = pred_probabilities(options, workdir, images, paths)
    if failure:
        return failure
    if client is None:
        answer = answer_here(folder, NAME, [np.fromfile(path, np.uint8) for path in paths])
        return compare(answer, expected, SAME_PROBABILITIES, f'{reason}; the repository run here against --mode pred')
    for model in (f'{NAME}_preprocessing', f'{NAME}_network', NAME):     # the ensemble's steps first
        shutil.rmtree(os.path.join(repository, model), ignore_errors=True)
        shutil.copytree(os.path.join(folder, model), os.path.join(repository, model))
        client.load_model(model)
    inputs, outputs = request(paths)
    answer = client.infer(NAME, inputs, outputs=outputs).as_numpy('probabilities')
    return compare(answer, expected, SAME_PROBABILITIES, f'Triton at {url} against --mode pred')


def triton_client(url, repository):
    """(a tritonclient gRPC client of the live server at `url`, None), or (None, why there is none)."""
    if not repository:
        return None, 'set TRITON_REPOSITORY to the model repository of a Triton server in explicit model-control mode'
    from tritonclient import grpc
    client = grpc.InferenceServerClient(url)
    try:
        client.is_server_live()
    except Exception as e:      # tritonclient's InferenceServerException: nothing listens there
        return None, f'no Triton server at {url}: {str(e).splitlines()[0][:200]}'
    return client, None


def validation_images(workdir):
    """(the folder of the digits' validation images, their paths as --mode pred lists them)."""
    digits_dataset(workdir)
    folder = os.path.join(os.path.abspath(workdir), 'digits', 'images', 'val')
    return folder, sorted(os.path.join(root, name) for root, _, names in os.walk(folder) for name in names
                          if name.endswith('.jpg'))


# ----------------------------------------------------------------------------------------------------------
# The weights both checks serve


def weights_source(options, workdir):
    """The float16 check's state on GPUs; on the CPU a float32 ResNet-18 written here."""
    if options.device == 'gpu':
        return os.path.join(workdir, 'float16', 'model_last.state')
    path = os.path.join(workdir, 'resnet18.params')
    if not os.path.exists(path):
        bootstrap.on_path()
        import mxnet as mx
        import models
        net = models.get_model(num_layers=18, num_classes=10, image_shape=(3, 32, 32))
        net.initialize(mx.init.Xavier())
        net.save_parameters(path)
    return path


def serving_flags(options, workdir):
    """The runner's flags of export and pred for the weights: float32 (pred's network is then the repository's),
    the DALI validation graph on the CPU (the repository's preprocessing), the digits' class names."""
    channels = '4' if options.device == 'gpu' else '3'
    return ['-n', '1', '--load', weights_source(options, workdir), *SMALL, '--image-shape', f'{channels},32,32',
            '--dtype', 'float32', '--data-root', digits_dataset(workdir), '--data-backend', 'dali-cpu',
            '--dali-validation-threads', '2']


def exported(options, workdir):
    """(the Triton repository of the weights, None), or (None, the check's (verdict, reason)) when it cannot be
    made; made once per workdir."""
    if not os.path.exists(weights_source(options, workdir)):
        return None, (None, 'needs the float16 check first')
    folder, workspace = os.path.join(workdir, 'triton'), os.path.join(workdir, 'export-triton')
    if not os.path.exists(folder):
        status, output = run(runner('--mode', 'export', *serving_flags(options, workdir), '--model-prefix', NAME,
                                    '--triton', folder, '--workspace', workspace))
        if status:
            return None, (False, f'export --triton: {last_error(output)}')
    return folder, None


def pred_probabilities(options, workdir, folder, paths):
    """(--mode pred's probabilities of the weights on the images of `folder`, in the order of `paths`, None), or
    (None, the check's failure)."""
    output_file = os.path.join(workdir, 'pred-triton.json')
    status, output = run(runner('--mode', 'pred', *serving_flags(options, workdir), '--data-pred', folder, '--topk',
                                '10', '--pred-output', output_file,
                                '--workspace', os.path.join(workdir, 'pred-triton')))
    if status:
        return None, (False, f'--mode pred: {last_error(output)}')
    with open(output_file) as f:
        found = {p['image']: p['top'] for p in json.load(f)['predictions']}
    probabilities = np.zeros((len(paths), 10))
    for row, path in enumerate(paths):
        for entry in found[path]:
            probabilities[row, entry['class']] = entry['probability']
    return probabilities, None


RUNS = {'tensorrt': check_tensorrt, 'triton': check_triton}


# ----------------------------------------------------------------------------------------------------------
# INT8 calibration cache for trtexec


def calibrate(argv=None):
    """`calibrate REPOSITORY --data-root D`: REPOSITORY/<name>_network/calibration.cache from --images training
    images of D/train.rec, preprocessed by the repository's DALI pipeline; TensorRT's entropy calibrator, on a GPU."""
    parser = argparse.ArgumentParser(prog='gpu_check_export.py calibrate', description=calibrate.__doc__)
    parser.add_argument('repository')
    parser.add_argument('--data-root', required=True, help='the folder of train.rec')
    parser.add_argument('--name', default='model', help='the repository\'s model name (export\'s --model-prefix)')
    parser.add_argument('--images', type=int, default=512, help='training images to calibrate on')
    options = parser.parse_args(argv)
    encoded, _ = records(os.path.join(options.data_root, 'train.rec'), options.images)
    network = os.path.join(options.repository, f'{options.name}_network')
    cache = os.path.join(network, 'calibration.cache')
    batches = list(preprocessed(options.repository, options.name, encoded))
    tensorrt_plan(os.path.join(network, '1', 'model.onnx'), max(len(b) for b in batches),
                  (image[None] for batch in batches for image in batch), cache)
    print(f'wrote {cache} ({len(encoded)} training images)')
    return 0


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='The INT8 calibration cache of a Triton repository for trtexec; '
                                     'this file\'s checks run from gpu_check.py (--only tensorrt,triton)')
    parser.add_argument('command', choices=['calibrate'], help='calibrate REPOSITORY --data-root D [--images N]')
    command, rest = parser.parse_known_args()
    sys.exit(calibrate(rest))
