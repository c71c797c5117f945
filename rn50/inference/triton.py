"""--mode export --triton DIR: a Triton Inference Server model repository that classifies encoded images with the
run's own validation preprocessing. Three models, each with its config.pbtxt written through Triton's own
ModelConfig message (tritonclient's model_config_pb2):

    DIR/<name>/config.pbtxt, 1/                      the ensemble: `image` (the file's bytes, uint8) in,
                                                     `probabilities` (float32, one per class, labels.txt) out
    DIR/<name>_preprocessing/config.pbtxt, 1/model.dali
                                                     DALI backend: the validation graph (dali.py), serialized by
                                                     DALI: decode, resize, centre crop, normalisation, layout
    DIR/<name>_network/config.pbtxt, 1/model.onnx    onnxruntime backend: export's ONNX network and a softmax

    repository = triton.Repository(name='model', input_shape=(3, 224, 224), class_names=names, max_batch_size=64)
    triton.check_folder(folder)                                   # before any work: new or empty, else RecipeError
    triton.write(folder, repository, onnx_path, serialize_preprocessing)

`serialize_preprocessing(path, input_name, max_batch_size)` writes model.dali (the composer's
dali.serialize_preprocessing). Every model batches dynamically up to `max_batch_size` images, the preprocessing
on CPU instances (its pipeline is CPU-only, as pred's), the network on GPUs where the server has them
(KIND_AUTO). The repository is built in a temporary folder beside DIR and renamed to DIR at the end: it appears
whole or not at all.
"""
import dataclasses
import os
import shutil
import tempfile

from rn50.errors import RecipeError

IMAGE, DATA, PROBABILITIES = 'image', 'data', 'probabilities'
LABELS = 'labels.txt'


@dataclasses.dataclass(frozen=True)
class Repository:
    """What the repository serves: `name`, the ensemble's (clients ask for it; the two models it runs are
    `<name>_preprocessing` and `<name>_network`); `input_shape`, the network's input per image, (3, H, W) or
    (H, W, 3); `class_names`, one per output in class order; `max_batch_size`, the largest batch each model takes."""
    name: str
    input_shape: tuple
    class_names: tuple
    max_batch_size: int

    @property
    def preprocessing(self):
        return f'{self.name}_preprocessing'

    @property
    def network(self):
        return f'{self.name}_network'


def check_folder(folder):
    """RecipeError unless `folder` can take the repository: absent, or an empty folder."""
    if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise RecipeError(f'--triton {folder} exists and is not an empty folder: give a new or empty folder for the '
                          'model repository (nothing was written)')


def configs(repository):
    """{model name: ModelConfig} of the repository's three models."""
    from tritonclient.grpc import model_config_pb2 as pb
    fp32, classes = pb.TYPE_FP32, len(repository.class_names)

    def model(name, **fields):
        return pb.ModelConfig(name=name, max_batch_size=repository.max_batch_size, **fields)

    ragged_image = pb.ModelInput(name=IMAGE, data_type=pb.TYPE_UINT8, dims=[-1], allow_ragged_batch=True)
    preprocessing = model(repository.preprocessing, backend='dali', input=[ragged_image],
                          output=[pb.ModelOutput(name=DATA, data_type=fp32, dims=repository.input_shape)],
                          instance_group=[pb.ModelInstanceGroup(kind=pb.ModelInstanceGroup.KIND_CPU, count=1)],
                          dynamic_batching=pb.ModelDynamicBatching())
    network = model(repository.network, platform='onnxruntime_onnx',
                    input=[pb.ModelInput(name=DATA, data_type=fp32, dims=repository.input_shape)],
                    output=[pb.ModelOutput(name=PROBABILITIES, data_type=fp32, dims=[classes], label_filename=LABELS)],
                    instance_group=[pb.ModelInstanceGroup(kind=pb.ModelInstanceGroup.KIND_AUTO, count=1)],
                    dynamic_batching=pb.ModelDynamicBatching())
    steps = [pb.ModelEnsembling.Step(model_name=repository.preprocessing, model_version=-1,
                                     input_map={IMAGE: IMAGE}, output_map={DATA: DATA}),
             pb.ModelEnsembling.Step(model_name=repository.network, model_version=-1,
                                     input_map={DATA: DATA}, output_map={PROBABILITIES: PROBABILITIES})]
    ensemble = model(repository.name, platform='ensemble',
                     input=[pb.ModelInput(name=IMAGE, data_type=pb.TYPE_UINT8, dims=[-1])],
                     output=[pb.ModelOutput(name=PROBABILITIES, data_type=fp32, dims=[classes], label_filename=LABELS)],
                     ensemble_scheduling=pb.ModelEnsembling(step=steps))
    return {config.name: config for config in (ensemble, preprocessing, network)}


def with_probabilities(onnx_path, output_path):
    """export's ONNX network (`data` in, logits out) with a softmax over the classes, its output named
    `probabilities`, written to `output_path`."""
    import onnx
    model = onnx.load(onnx_path)
    (logits,) = model.graph.output
    model.graph.node.append(onnx.helper.make_node('Softmax', [logits.name], [PROBABILITIES], axis=1))
    probabilities = onnx.ValueInfoProto()
    probabilities.CopyFrom(logits)
    probabilities.name = PROBABILITIES
    del model.graph.output[:]
    model.graph.output.append(probabilities)
    onnx.checker.check_model(model)
    onnx.save(model, output_path)


def write(folder, repository, onnx_path, serialize_preprocessing):
    """The repository of `repository` in `folder` (checked by check_folder), from export's ONNX file at
    `onnx_path`; `serialize_preprocessing(path, input_name, max_batch_size)` writes model.dali. Built in a
    temporary folder beside `folder`, renamed at the end; a failure leaves nothing behind."""
    from google.protobuf import text_format
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    building = tempfile.mkdtemp(prefix=f'.{os.path.basename(folder)}.partial-', dir=parent)
    try:
        for name, config in configs(repository).items():
            os.makedirs(os.path.join(building, name, '1'))
            with open(os.path.join(building, name, 'config.pbtxt'), 'w') as f:
                f.write(text_format.MessageToString(config))
        for name in (repository.name, repository.network):
            with open(os.path.join(building, name, LABELS), 'w') as f:
                f.write(''.join(f'{label}\n' for label in repository.class_names))
        serialize_preprocessing(os.path.join(building, repository.preprocessing, '1', 'model.dali'), IMAGE,
                                repository.max_batch_size)
        with_probabilities(onnx_path, os.path.join(building, repository.network, '1', 'model.onnx'))
        if os.path.isdir(folder):
            os.rmdir(folder)          # empty (check_folder): the rename puts the repository in its place
        os.rename(building, folder)
    finally:
        shutil.rmtree(building, ignore_errors=True)
