"""scripts/gpu_check_export.py's parts that need neither a GPU nor a Triton server, on a repository export writes
here: the request (each file's bytes zero-padded to one length), the repository's models run here on it (the
padding changes nothing), the comparison's verdicts, the calibration batches from a .rec, and the checks' SKIP
without TensorRT or a server."""
import importlib
import os
import sys
import types

import numpy as np
import pytest

from conftest import ROOT
from test_triton import checkpoint_of, export_in_process


@pytest.fixture(scope='module')
def checks():
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    try:
        yield importlib.import_module('gpu_check_export')
    finally:
        sys.path.remove(os.path.join(ROOT, 'scripts'))


@pytest.fixture(scope='module')
def repository(tmp_path_factory):
    """A repository of a ResNet-10 at 32x32 for 10 classes, batches of up to 8 (made once: tests read it)."""
    workspace = tmp_path_factory.mktemp('repository')
    checkpoint_of(workspace / 'model_best.params')
    export_in_process(workspace, '--triton', str(workspace / 'triton'))
    return workspace / 'triton'


def some_digits(digits, count=11):
    return sorted(str(path) for path in (digits / 'images' / 'val').rglob('*.jpg'))[::30][:count]


@pytest.mark.unit
def test_the_request_pads_the_files_and_the_models_answer_it_as_each_file_alone(checks, repository, digits):
    paths = some_digits(digits)
    inputs, outputs = checks.request(paths)
    encoded = [np.fromfile(path, np.uint8) for path in paths]
    longest = max(len(e) for e in encoded)
    assert [i.name() for i in inputs] == ['image'] and inputs[0].datatype() == 'UINT8'
    assert inputs[0].shape() == [len(paths), longest] and [o.name() for o in outputs] == ['probabilities']
    batch = checks.pad_batch(encoded)
    assert batch.dtype == np.uint8 and all((row[len(e):] == 0).all() and (row[:len(e)] == e).all()
                                           for row, e in zip(batch, encoded))
    answer = checks.answer_here(str(repository), 'model', encoded)     # 11 images: batches of 8 and 3
    assert answer.shape == (11, 10) and np.allclose(answer.sum(1), 1, atol=1e-5)
    alone = np.concatenate([checks.answer_here(str(repository), 'model', [e]) for e in encoded])
    assert np.array_equal(answer, alone)
    batches = list(checks.preprocessed(str(repository), 'model', encoded))
    assert [b.shape for b in batches] == [(8, 3, 32, 32), (3, 3, 32, 32)] and batches[0].dtype == np.float32


@pytest.mark.unit
def test_the_comparison_passes_the_same_answer_and_fails_a_difference_or_another_class(checks):
    expected = np.array([[0.9, 0.05, 0.05], [0.4, 0.38, 0.22], [0.1, 0.1, 0.8]])
    passed, detail = checks.compare(expected + 1e-4, expected, 1e-3, 'Triton')
    assert passed and detail.startswith('Triton: 3 images, largest probability difference 0.0001 (allowed 0.001)')
    assert detail.endswith('top class different on 0 of the 2 clear ones')
    near_tie = expected.copy()
    near_tie[1] = [0.38, 0.4, 0.22]                        # not clear in the expected answer: no verdict on it
    assert checks.compare(near_tie, expected, 0.05, 'x')[0]
    flipped = expected.copy()
    flipped[2] = [0.1, 0.8, 0.1]
    assert checks.compare(flipped, expected, 1.0, 'x') == (False, 'x: 3 images, largest probability difference 0.7 '
                                                                  '(allowed 1), top class different on 1 of the 2 '
                                                                  'clear ones')
    assert not checks.compare(expected + 2e-3, expected, 1e-3, 'x')[0]
    assert checks.compare(expected[:2], expected, 1e-3, 'x') == (False, 'x: (2, 3) probabilities for (3, 3)')


@pytest.mark.unit
def test_calibration_batches_come_from_the_training_records(checks, repository, digits):
    encoded, labels = checks.records(str(digits / 'rec' / 'train.rec'), 20)
    assert len(encoded) == 20 and labels.shape == (20,) and set(labels) <= set(range(10))
    assert all(e[:2].tobytes() == b'\xff\xd8' for e in encoded)              # JPEG files as prepare_dataset stored them
    batches = list(checks.preprocessed(str(repository), 'model', encoded))
    assert sum(len(b) for b in batches) == 20 and np.isfinite(np.concatenate(batches)).all()


@pytest.mark.unit
def test_without_tensorrt_or_a_server_the_checks_skip_saying_why(checks, tmp_path, monkeypatch):
    options = types.SimpleNamespace(device='gpu')
    monkeypatch.setitem(sys.modules, 'tensorrt', None)          # as where it is not installed
    assert checks.check_tensorrt(options, str(tmp_path)) == (None, 'TensorRT is not installed (pip install tensorrt, '
                                                                    "or run in NVIDIA's TensorRT or Triton container)")
    monkeypatch.delenv('TRITON_REPOSITORY', raising=False)
    verdict, reason = checks.check_triton(options, str(tmp_path))     # on GPUs: no twin
    assert verdict is None and reason.startswith('set TRITON_REPOSITORY')
    monkeypatch.setenv('TRITON_REPOSITORY', str(tmp_path / 'models'))
    monkeypatch.setenv('TRITON_URL', 'localhost:1')              # nothing listens there
    verdict, reason = checks.check_triton(options, str(tmp_path))
    assert verdict is None and reason.startswith('no Triton server at localhost:1'), reason
    assert os.listdir(tmp_path) == []                            # nothing exported, nothing trained


@pytest.mark.unit
def test_the_readme_s_request_is_the_repository_s(checks, repository, digits, monkeypatch):
    """The README's tritonclient lines, run with a client that answers here (the repository's models on the CPU)
    instead of a server: they ask the ensemble for its output with its input's name, type and shape, carrying the
    file's bytes, as scripts/gpu_check_export.py's request does."""
    import tritonclient.grpc
    from test_readme import code_blocks
    from test_triton import read_configs
    path = some_digits(digits, 1)[0]
    asked = []

    class HereClient:
        def __init__(self, url):
            assert url == 'localhost:8001'

        def infer(self, model, inputs, outputs):
            asked.append((model, inputs, outputs))
            data = np.frombuffer(inputs[0]._get_content(), np.uint8).reshape(inputs[0].shape())
            probabilities = checks.answer_here(str(repository), 'model', list(data))
            return types.SimpleNamespace(as_numpy=lambda name: probabilities)
    monkeypatch.setattr(tritonclient.grpc, 'InferenceServerClient', HereClient)
    snippet = next(block for block in code_blocks('python') if 'tritonclient' in block)
    exec(snippet.replace("'new_photos/cat.jpg'", repr(path)), {})
    (model, inputs, outputs), = asked
    ensemble = read_configs(repository)[model]
    assert ensemble.platform == 'ensemble'
    assert [(i.name(), i.datatype()) for i in inputs] == [(ensemble.input[0].name, 'UINT8')]
    assert inputs[0].shape() == [1, os.path.getsize(path)]
    assert inputs[0]._get_content() == open(path, 'rb').read()
    assert [o.name() for o in outputs] == [ensemble.output[0].name]
    assert outputs[0]._get_tensor().parameters['classification'].int64_param == 5
    ours, _ = checks.request([path])
    assert ours[0]._get_content() == inputs[0]._get_content() and ours[0].shape() == inputs[0].shape()
