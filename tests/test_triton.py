"""--mode export --triton DIR (rn50/inference/triton.py, dali.serialize_preprocessing), checked by the programs that
read it: every config.pbtxt parses into Triton's own ModelConfig message (tritonclient's) and the ensemble's
wiring is complete; the serialized pipeline, deserialized by DALI and run on the CPU on the files' bytes, then
onnxruntime on the network model, gives --mode pred's probabilities, on the digits and on photographs; a folder in
use, a class-name file of another count and a failure while writing leave nothing behind."""
import json
import os
import shutil

import mxnet as mx
import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image

import models
from conftest import exported, resolved, train_main
from rn50.inference import triton
from rn50.errors import RecipeError
from test_preprocessing import clear, predictions, run, snippet_bound, train_py  # noqa: F401 (fixtures)

# A ResNet-10 export from a checkpoint, on synthetic data (no training, no dataset): 10 classes at 32x32
SYNTHETIC = ['--num-layers', '10', '--num-classes', '10', '--image-shape', '3,32,32', '--data-backend', 'synthetic',
             '--num-examples', '16', '--batch-size', '8', '--mode', 'export', '--seed', '1']
# pred's probabilities, from the same input through MXNet's fused graph instead of onnxruntime
SAME_INPUT = 1e-5


def checkpoint_of(path, num_classes=10):
    net = models.get_model(num_layers=10, num_classes=num_classes, image_shape=(3, 32, 32))
    net.initialize(mx.init.Xavier())
    net.save_parameters(str(path))
    return path


def export_in_process(workspace, *extra):
    args = resolved(SYNTHETIC + ['--workspace', str(workspace), *extra])
    return exported(args)


def read_configs(folder):
    """{model name: ModelConfig} of every config.pbtxt of a repository, parsed by Triton's own message."""
    from tritonclient.grpc import model_config_pb2
    configs = {}
    for name in sorted(os.listdir(folder)):
        config = model_config_pb2.ModelConfig()
        text_format.Parse((folder / name / 'config.pbtxt').read_text(), config)
        assert config.name == name
        configs[name] = config
    return configs


def tensors(config, kind):
    return {tensor.name: (tensor.data_type, tuple(tensor.dims)) for tensor in getattr(config, kind)}


@pytest.mark.unit
def test_every_config_parses_into_triton_s_model_config_and_the_ensemble_is_wired(tmp_path):
    """Three models: the ensemble's steps name the other two, every tensor a step reads is the ensemble's input or
    an earlier step's output with the same type and dims, and the ensemble's outputs come from its steps; the
    DALI model and the ONNX network are there, the ONNX network's inputs and outputs are its config's; batches up
    to --batch-size, dynamic batching, instance groups, the class names as the output's labels."""
    import onnx
    checkpoint_of(tmp_path / 'model_best.params')
    outputs = export_in_process(tmp_path, '--triton', str(tmp_path / 'triton'))
    folder = tmp_path / 'triton'
    assert outputs['triton'] == str(folder)
    configs = read_configs(folder)
    assert sorted(configs) == ['model', 'model_network', 'model_preprocessing']
    ensemble, preprocessing, network = configs['model'], configs['model_preprocessing'], configs['model_network']
    assert ensemble.platform == 'ensemble' and preprocessing.backend == 'dali'
    assert network.platform == 'onnxruntime_onnx'
    assert {config.max_batch_size for config in configs.values()} == {8}
    assert tensors(ensemble, 'input') == {'image': (triton_type('TYPE_UINT8'), (-1,))}
    assert tensors(ensemble, 'output') == {'probabilities': (triton_type('TYPE_FP32'), (10,))}
    available = dict(tensors(ensemble, 'input'))
    for step in ensemble.ensemble_scheduling.step:
        model = configs[step.model_name]
        assert step.model_version == -1
        assert set(step.input_map) == set(tensors(model, 'input'))
        for inside, outside in step.input_map.items():
            assert available[outside] == tensors(model, 'input')[inside], (step.model_name, inside)
        assert set(step.output_map) == set(tensors(model, 'output'))
        available.update({outside: tensors(model, 'output')[inside] for inside, outside in step.output_map.items()})
    assert all(available[name] == spec for name, spec in tensors(ensemble, 'output').items())
    assert tensors(preprocessing, 'output') == tensors(network, 'input') == {'data': (triton_type('TYPE_FP32'),
                                                                                      (3, 32, 32))}
    assert preprocessing.input[0].allow_ragged_batch      # requests of images of other sizes batch together
    for config in (preprocessing, network):
        assert config.HasField('dynamic_batching') and len(config.instance_group) == 1
    assert preprocessing.instance_group[0].kind == preprocessing.instance_group[0].KIND_CPU
    for name in ('model', 'model_network'):
        config = configs[name]
        assert config.output[0].label_filename == 'labels.txt'
        assert (folder / name / 'labels.txt').read_text().splitlines() == [f'class {i}' for i in range(10)]
    assert (folder / 'model_preprocessing' / '1' / 'model.dali').stat().st_size > 0
    assert os.listdir(folder / 'model' / '1') == []
    graph = onnx.load(str(folder / 'model_network' / '1' / 'model.onnx')).graph
    assert [i.name for i in graph.input] == ['data'] and [o.name for o in graph.output] == ['probabilities']
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim][1:] == [3, 32, 32]


def triton_type(name):
    from tritonclient.grpc import model_config_pb2
    return model_config_pb2.DataType.Value(name)


@pytest.mark.unit
def test_a_folder_in_use_another_class_count_and_a_failed_write_leave_nothing(tmp_path, monkeypatch):
    workspace = tmp_path / 'run'
    workspace.mkdir()
    checkpoint_of(workspace / 'model_best.params')
    used = tmp_path / 'used'
    used.mkdir()
    (used / 'mine.txt').write_text('keep')
    names = tmp_path / 'names.txt'
    names.write_text('\n'.join(f'n{i}' for i in range(12)))
    new = tmp_path / 'new'
    for extra, message in ((['--triton', used], f'--triton {used} exists and is not an empty folder'),
                           (['--triton', new, '--classes', names], 'names 12 classes but the network has 10'),
                           (['--triton', new, '--mode', 'val'], '--triton writes a model repository in --mode export, '
                                                                'not --mode val')):
        result = train_main(*SYNTHETIC, '--workspace', workspace, *extra)
        errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
        assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-1500:]
    assert os.listdir(used) == ['mine.txt'] and not (workspace / 'export').exists()

    def broken(*args):
        raise RuntimeError('the disk is full')
    monkeypatch.setattr(triton, 'with_probabilities', broken)
    with pytest.raises(RecipeError, match='RuntimeError: the disk is full.*nothing was written'):
        export_in_process(workspace, '--triton', str(new))
    assert sorted(os.listdir(tmp_path)) == ['names.txt', 'run', 'used']     # no repository, no partial one
    assert os.listdir(workspace / 'export') == []


def photographs(folder):
    """A folder of scikit-learn's two sample photographs (427x640 JPEGs as a camera wrote them) and crops of them
    re-encoded: portrait, square, small, wide."""
    import sklearn.datasets
    folder.mkdir()
    for name in ('china.jpg', 'flower.jpg'):
        source = os.path.join(os.path.dirname(sklearn.datasets.__file__), 'images', name)
        shutil.copy(source, folder)
        image = Image.open(source)
        name = os.path.splitext(os.path.basename(source))[0]
        for box in ((100, 0, 380, 427), (200, 100, 420, 320), (0, 0, 97, 61), (0, 150, 640, 330)):
            path = folder / f'{name}-{box[2] - box[0]}x{box[3] - box[1]}.jpg'
            image.crop(box).save(path, quality=90)


def pred_probabilities(digits, weights, folder, workspace):
    train_py(digits, workspace, '--mode', 'pred', '--load', weights, '--data-pred', folder, '--topk', '10',
             '--pred-output', workspace / 'pred.json')
    found = {}
    for prediction in json.loads((workspace / 'pred.json').read_text())['predictions']:
        found[prediction['image']] = np.zeros(10)
        for entry in prediction['top']:
            found[prediction['image']][entry['class']] = entry['probability']
    return found


def triton_probabilities(folder, paths):
    """The repository's two models as Triton runs them, on the CPU: the serialized pipeline deserialized by DALI
    (batches of max_batch_size: requests of zero-padded file bytes, as a client sends images of several sizes in
    one request), then onnxruntime on the network model."""
    import onnxruntime
    from nvidia.dali import Pipeline, types
    batch = read_configs(folder)['model'].max_batch_size
    pipe = Pipeline.deserialize(filename=str(folder / 'model_preprocessing' / '1' / 'model.dali'), batch_size=batch,
                                num_threads=2, device_id=types.CPU_ONLY_DEVICE_ID, exec_pipelined=False,
                                exec_async=False, prefetch_queue_depth=1)
    pipe.build()
    session = onnxruntime.InferenceSession(str(folder / 'model_network' / '1' / 'model.onnx'),
                                           providers=['CPUExecutionProvider'])
    found = {}
    for start in range(0, len(paths), batch):
        chunk = paths[start:start + batch]
        encoded = [np.fromfile(path, np.uint8) for path in chunk]
        longest = max(len(e) for e in encoded)
        pipe.feed_input('image', [np.pad(e, (0, longest - len(e))) for e in encoded])
        (images,) = pipe.run()
        probabilities = session.run(None, {'data': np.asarray(images.as_tensor())})[0]
        found.update(zip(chunk, probabilities))
    return found


@pytest.mark.integration
def test_the_repository_s_dali_pipeline_and_network_give_pred_s_probabilities(digits, run, predictions, tmp_path):
    """The run's weights exported with --triton: on all 359 validation digits and on 10 photographs, DALI's
    deserialized pipeline and onnxruntime give --mode pred's probabilities: within SAME_INPUT for a run that
    validates with DALI (pred runs the very graph); for an ImageRecordIter run (OpenCV's resize, which DALI
    follows within a grey level) within the README snippet's bound, with pred's top class wherever it leads clearly."""
    backend, workspace = run
    weights = workspace / 'model_best.params'
    train_py(digits, tmp_path / 'export', '--mode', 'export', '--load', weights, '--triton', tmp_path / 'triton')
    found, _ = predictions
    photographs(tmp_path / 'photos')
    found = dict(found, **pred_probabilities(digits, weights, tmp_path / 'photos', tmp_path / 'pred'))
    served = triton_probabilities(tmp_path / 'triton', sorted(found))
    differences = {path: float(np.abs(served[path] - found[path]).max()) for path in found}
    worst = max(differences, key=differences.get)
    print(f'{backend}: Triton\'s models on the CPU against pred over {len(found)} images: largest probability '
          f'difference {differences[worst]:.2g} ({os.path.basename(worst)}), photographs '
          f'{max(d for p, d in differences.items() if "photos" in p):.2g}')
    assert len(found) == 369
    if backend == 'dali-cpu':
        assert differences[worst] <= SAME_INPUT
    else:
        bound = snippet_bound()
        assert differences[worst] <= bound
        assert all(served[path].argmax() == found[path].argmax() for path in found if clear(found[path], 2 * bound))
