"""The deployment snippets of the README and docs/inference.md run as printed, by their real consumers, with only
their file names replaced (issue 56, items 1 and 5), on one export (a ResNet-50 at 32x32 for 10 classes, with a
Triton repository): the README's onnxruntime snippet in the project's Python, then its PyTorch lines and
docs/inference.md's torchvision and timm calls in PyTorch's environment (tests/torch_consumers.py) on the
snippet's own `pixels`; docs/inference.md's DALI lines on the repository's model.dali, and its sed line on the
network's config. Every python and bash block of the two documents is run by a test or listed below with the
reason it cannot run here (a GPU, a server, Docker): a block nobody classified fails. The README's PyTorch lines
crashed as printed (the snippet's `pixels` were float64) while a test ran them on its own float32 input."""
import json
import os
import re
import shutil
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

import models
from conftest import ROOT, built_once, exported, resolved
from test_readme import README, commands
from test_torchvision_weights import TOLERANCE, consumers, trained_looking

INFERENCE_MD = os.path.join(ROOT, 'docs', 'inference.md')
DOCUMENTS = {'README.md': README, 'docs/inference.md': INFERENCE_MD}
THIS = 'test_deployment_snippets.py'
CHAIN = f'{THIS}::test_the_readme_s_onnx_then_pytorch_snippets_and_the_docs_calls_run_as_printed_and_agree'
RUNNER_LINES = 'test_readme.py::test_every_runner_command_of_the_readme_and_docs_is_accepted_as_printed'
# A line of each block the tests here run
ONNX_LINE = "p = json.load(open(model[:-len('.onnx')] + '.preprocessing.json'))"
PYTORCH_LINE = "print(names[int(model(torch.from_numpy(pixels[None])).argmax())])"
DOCS_TORCH_LINE = "model = timm.create_model('resnet50', num_classes=10, pretrained=True,"
DALI_LINE = 'pipe = Pipeline.deserialize('
SED_LINE = 'sed -i '

# The tests that run a block (or some of its lines) as printed, the block named by one of its lines:
# {(document, line): [tests/FILE::TEST, ...]}. A bash block of ./runner lines alone (no <placeholder>) needs no
# entry: RUNNER_LINES runs each through the runner's and train.py's checks (--dry-run), and its workspaces and
# outputs are walked by test_readme.py's test_the_documented_commands_do_not_collide_when_run_in_the_order_printed.
RUN = {
    ('README.md', ONNX_LINE): [
        CHAIN,
        'test_preprocessing.py::test_export_writes_its_preprocessing_and_the_readme_snippet_gives_pred_s_probabilities',
        'test_readme.py::test_the_quick_start_takes_a_folder_of_images_to_a_model_predictions_and_onnx'],
    ('README.md', PYTORCH_LINE): [CHAIN],
    ('README.md', "request = triton.InferInput('image', list(image.shape), 'UINT8')"): [
        'test_gpu_check_export.py::test_the_readme_s_request_is_the_repository_s'],
    ('README.md', 'python scripts/prepare_dataset.py photos data/photos --val-fraction 0.2'): [
        'test_readme.py::test_the_quick_start_takes_a_folder_of_images_to_a_model_predictions_and_onnx'],
    ('docs/inference.md', DOCS_TORCH_LINE): [CHAIN],
    ('docs/inference.md', DALI_LINE): [
        f'{THIS}::test_the_docs_dali_lines_run_model_dali_as_triton_does_and_give_pred_s_input'],
    ('docs/inference.md', SED_LINE): [f'{THIS}::test_the_docs_sed_line_makes_the_network_s_config_a_tensorrt_plan_s'],
}
# What cannot run here, and why: {(document, line): reason}
SKIPPED = {
    ('README.md', 'make demo'): 'make test runs this suite and make demo trains the demo (8.5 minutes): they are what '
                                'CI runs (.ci/run), not a test of it',
    ('README.md', './scripts/prepare_imagenet.sh'): "ImageNet's raw files; templates (<path ...>, SRC OUT [...]): "
                                                    "prepare_dataset.py's flags run in tests/test_prepare_dataset.py",
    ('README.md', 'docker run --gpus all'): "Docker, a GPU and NGC's Triton image (its request: the tritonclient "
                                            'block)',
    ('README.md', 'python benchmark.py'): '1, 4 and 8 GPUs of 512 images a step; tests/test_benchmark.py runs '
                                          'sweeps on this CPU',
    ('README.md', 'srun --mpi=pmix'): 'a SLURM cluster of 8-GPU nodes; its ./runner lines: ' + RUNNER_LINES +
                                      ' on a mocked 8-GPU node',
    ('docs/inference.md', '<number of gpus>'): 'a template (<...>): its concrete forms are the val and pred lines '
                                               'on the demo (' + RUNNER_LINES + ')',
    ('docs/inference.md', 'docker run --gpus all'): "Docker, a GPU and NGC's Triton image",
    ('docs/inference.md', 'model.plan --fp16'): 'trtexec: TensorRT and a GPU (the sed line is run)',
    ('docs/inference.md', 'gpu_check_export.py calibrate'): "TensorRT's Python package and a GPU (calibrate), "
                                                            'then trtexec',
}

# The shared export, from a checkpoint: no dataset, no training
EXPORT = ['--num-layers', '50', '--num-classes', '10', '--image-shape', '3,32,32', '--data-backend', 'synthetic',
          '--num-examples', '8', '--batch-size', '8', '--mode', 'export', '--seed', '1']

pytestmark = pytest.mark.xdist_group('deployment')      # the tests of the one export on the worker that makes it


def blocks(document):
    """(language, text) of each fenced block of a document that names its language."""
    with open(DOCUMENTS[document], encoding='utf-8') as f:
        return re.findall(r'^```(\w+)\n(.*?)^```', f.read(), re.M | re.S)


def block(document, line):
    """The one block of `document` that holds `line`."""
    (found,) = [text for _, text in blocks(document) if line in text]
    return found


def runner_lines_only(text):
    return all(argv[0] == './runner' and not any('<' in word for word in argv) for argv in commands(text))


def as_here(text, files):
    """A block with its file names replaced by those of `files` ({name: path}), each of which it names."""
    for name, path in files.items():
        assert repr(name) in text, f'the block no longer names {name!r}: {text}'
        text = text.replace(repr(name), repr(str(path)))
    return text


@pytest.mark.unit
def test_every_python_and_bash_block_of_the_readme_and_inference_md_is_run_or_listed_as_skipped():
    """Each block of the two documents is run by a test named in RUN, is ./runner lines alone (RUNNER_LINES), or
    is listed in SKIPPED with its reason; every entry names one block, and every test it names exists."""
    problems = []
    for document in DOCUMENTS:
        found = blocks(document)
        for language, text in found:
            named = [line for (doc, line) in {**RUN, **SKIPPED} if doc == document and line in text]
            if language not in ('python', 'bash'):
                problems.append(f'{document}: a {language} block: make it python or bash, and classify it')
            elif not named and not (language == 'bash' and runner_lines_only(text)):
                problems.append(f'{document}: no test runs this block and SKIPPED does not list it:\n{text}')
        for (doc, line) in list(RUN) + list(SKIPPED):
            if doc == document and len([text for _, text in found if line in text]) != 1:
                problems.append(f'{document}: {line!r} names no block, or several')
    for tests in list(RUN.values()) + [[RUNNER_LINES]]:
        for test in tests:
            file, name = test.split('::')
            with open(os.path.join(ROOT, 'tests', file), encoding='utf-8') as f:
                if f'\ndef {name}(' not in f.read():
                    problems.append(f'{test}: no such test')
    assert not problems, '\n'.join(problems)


def export_args(workspace, *extra):
    return resolved(EXPORT + ['--workspace', str(workspace), *extra])


@pytest.fixture(scope='session')
def deployment(tmp_path_factory):
    """The workspace of a ResNet-50 checkpoint (random weights and batchnorm statistics, the residual branches
    scaled down: logits of a few units, as a trained network's), exported once for the whole run with
    --triton: export/ and triton/. Tests read it."""
    def build(workspace):
        mx.random.seed(5)
        net = trained_looking(models.get_model(num_layers=50, num_classes=10, image_shape=(3, 32, 32)))
        net.save_parameters(str(workspace / 'model_best.params'))
        exported(export_args(workspace, '--triton', str(workspace / 'triton')))
    return built_once(tmp_path_factory, 'deployment', build)


def photographs():
    """scikit-learn's two sample photographs (427x640 JPEGs as a camera wrote them): the users' new photos."""
    import sklearn.datasets
    folder = os.path.join(os.path.dirname(sklearn.datasets.__file__), 'images')
    return [os.path.join(folder, name) for name in ('china.jpg', 'flower.jpg')]


@pytest.mark.integration
def test_the_readme_s_onnx_then_pytorch_snippets_and_the_docs_calls_run_as_printed_and_agree(deployment, tmp_path):
    """The README's onnxruntime snippet, as a user runs it (a program of the project's Python), classifies a
    photograph into float32 `pixels`; then, in PyTorch's environment with what it left (`names`, `pixels` in
    their dtype), the README's PyTorch lines and docs/inference.md's torchvision and timm calls run as printed:
    the PyTorch lines print the snippet's class, and the three networks they load give onnxruntime's logits within
    TOLERANCE."""
    export = deployment / 'export'
    classes = tmp_path / 'classes.json'
    classes.write_text(json.dumps({'classes': [{'name': f'class {i}'} for i in range(10)]}))
    onnx_snippet = as_here(block('README.md', ONNX_LINE), {'runs/photos/export/model.onnx': export / 'model.onnx',
                                                              'new_photos/cat.jpg': photographs()[0],
                                                              'data/photos/classes.json': classes})
    left = ''.join(f'np.save({str(tmp_path / name)!r}, {name})\n' for name in ('pixels', 'logits'))
    left += f'json.dump(names, open({str(tmp_path / "names.json")!r}, "w"))\n'
    result = subprocess.run([sys.executable, '-c', onnx_snippet + left], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    pixels, logits = np.load(tmp_path / 'pixels.npy'), np.load(tmp_path / 'logits.npy')
    assert pixels.dtype == np.float32 and pixels.shape == (3, 32, 32) and logits.shape == (1, 10)
    top = np.sort(logits[0])
    assert top[-1] - top[-2] > 100 * TOLERANCE                 # a class the PyTorch lines must name too
    assert result.stdout == f'class {logits.argmax()}\n'

    weights = {'runs/photos/export/model.torchvision.safetensors': export / 'model.torchvision.safetensors'}
    snippets = [as_here(block('README.md', PYTORCH_LINE), weights),
                as_here(block('docs/inference.md', DOCS_TORCH_LINE), weights)]
    consumers([{'snippets': snippets, 'names': json.loads((tmp_path / 'names.json').read_text()),
                'pixels': str(tmp_path / 'pixels.npy'), 'outputs': str(tmp_path / 'torch')}], tmp_path)
    assert (tmp_path / 'torch.printed.txt').read_text() == result.stdout
    loaded = np.load(tmp_path / 'torch.models.npy')        # README's torchvision, docs' torchvision and timm
    assert loaded.shape == (3, 10)
    difference = np.abs(loaded - logits).max()
    print(f'PyTorch against onnxruntime on the snippet\'s pixels: largest logit difference {difference:.2g} '
          f'(logits up to {np.abs(logits).max():.1f})')
    assert difference < TOLERANCE


@pytest.mark.integration
def test_the_docs_dali_lines_run_model_dali_as_triton_does_and_give_pred_s_input(deployment):
    """docs/inference.md's DALI lines, in the project's Python (DALI's consumer), on the repository's model.dali
    and two photographs of other sizes in one batch: `data` is pred's very input for each file (DALI's validation
    graph of the run, dali.PredictionImages), float32 in the network's shape."""
    import dali
    from rn50.data import contract
    paths = photographs()
    code = as_here(block('docs/inference.md', DALI_LINE), {
        'runs/photos/triton/model_preprocessing/1/model.dali': deployment / 'triton' / 'model_preprocessing' / '1' /
        'model.dali', 'new_photos/cat.jpg': paths[0], 'new_photos/dog.jpg': paths[1]})
    namespace = {}
    exec(compile(code, 'docs/inference.md', 'exec'), namespace)
    data = namespace['data']
    assert data.dtype == np.float32 and data.shape == (2, 3, 32, 32)
    pred = dali.PredictionImages(contract.Images.of(export_args(deployment)))
    for row, path in zip(data, paths):
        np.testing.assert_array_equal(row[None], pred.load(path).asnumpy())


@pytest.mark.integration
def test_the_docs_sed_line_makes_the_network_s_config_a_tensorrt_plan_s(deployment, tmp_path):
    """The TensorRT block's sed line, run by bash on a copy of the repository's network config (its /models/ the
    copy's folder), leaves a config that Triton's ModelConfig parses, naming the plan's platform and nothing else
    changed."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2
    shutil.copytree(deployment / 'triton' / 'model_network', tmp_path / 'model_network')
    (line,) = [line for line in block('docs/inference.md', SED_LINE).splitlines() if line.startswith('sed ')]
    result = subprocess.run(['bash', '-c', line.replace('/models/', f'{tmp_path}/')], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    original, changed = (text_format.Parse((folder / 'model_network' / 'config.pbtxt').read_text(),
                                           model_config_pb2.ModelConfig())
                         for folder in (deployment / 'triton', tmp_path))
    assert original.platform == 'onnxruntime_onnx' and changed.platform == 'tensorrt_plan'
    changed.platform = original.platform
    assert changed == original
