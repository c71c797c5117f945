"""One preprocessing for validation, pred and the exported model (issue 37, items 3 and 5): every validation
backend, `--mode pred` and export's `<model>.preprocessing.json` resize and crop as the run validated, so that
pred over the validation images gives val's top-1 and the README's onnxruntime snippet gives pred's
probabilities. The runs are ResNet-10s trained on the digits (32x32 JPEGs) at 24x24 after a 28 resize: the
resize shrinks, where DALI's antialiasing and OpenCV's plain linear interpolation part."""
import contextlib
import hashlib
import io
import json
import os
import re

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from rn50.checkpoints import checkpoint
import dali
import models
import train
from conftest import TRAINED_NET, TRAINED_RUN, built_once, digits_flags, resolved, run_mode, train_main
from rn50.errors import RecipeError
from test_readme import README, code_blocks
from rn50.data import contract
from rn50.data import validation_resize
from rn50.nets.network import Network

# conftest's TRAINED_NET but for its backend: the runs here are of both; [--num-layers 10, --seed 4, --image-shape
# 3,24,24, --data-val-resize 28]
MODEL = [flag for flag in TRAINED_NET if flag not in ('--data-backend', 'mxnet')]
# pred and validation compute the same input: their probabilities differ by the network's rounding alone
# (one image at a time against batches of 64, oneDNN's fused graph against the plain one).
SAME_INPUT = 1e-4


def train_py(digits, workspace, *extra, check=True):
    return run_mode(*digits_flags(digits, batch=64), *MODEL, '--workspace', workspace, *extra, check=check)


@pytest.fixture(scope='module', params=['dali-cpu', 'mxnet'])
def run(request, digits, trained_digits, tmp_path_factory):
    """(backend, workspace) of a ResNet-10 of about 90% top-1 on the digits whose run trained and validated with
    that backend, made once for the whole run: tests read it. With mxnet it is conftest's trained_digits (MODEL's
    run); with DALI, a run of one more epoch (of 512 images) from its weights, at a tenth of its learning rate."""
    if request.param == 'mxnet':
        return request.param, trained_digits

    def train(workspace):
        train_py(digits, workspace, '--data-backend', request.param, '--batch-size', '32', *TRAINED_RUN,
                 '--num-epochs', '1', '--num-examples', '512', '--lr', '0.02', '--warmup-epochs', '0',
                 '--load', trained_digits / 'model_best.params')
    return request.param, built_once(tmp_path_factory, f'preprocessing-{request.param}', train)


@pytest.fixture(scope='module')
def predictions(run, digits, tmp_path_factory):
    """--mode pred of the run's weights over the validation folder, made once for the whole run: {file:
    probabilities of the 10 classes}, and its log."""
    backend, workspace = run

    def predict(folder):
        result = train_py(digits, folder, '--mode', 'pred', '--load', workspace / 'model_best.params', '--data-pred',
                          digits / 'images' / 'val', '--topk', '10', '--pred-output', folder / 'pred.json')
        (folder / 'stderr.txt').write_text(result.stderr)
    folder = built_once(tmp_path_factory, f'preprocessing-{backend}-pred', predict)
    found = {}
    for prediction in json.loads((folder / 'pred.json').read_text())['predictions']:
        found[prediction['image']] = np.zeros(10)
        for entry in prediction['top']:
            found[prediction['image']][entry['class']] = entry['probability']
    return found, (folder / 'stderr.txt').read_text()


def labels_of(digits, files):
    folders = [c['folder'] for c in json.loads((digits / 'rec' / 'classes.json').read_text())['classes']]
    return np.array([folders.index(os.path.basename(os.path.dirname(f))) for f in files])


def validation_probabilities(digits, workspace, backend):
    """{file: probabilities} of the trained network on the validation loader's images of `backend` (the .rec
    records matched to the files of images/val by their bytes: prepare_dataset.py stores JPEGs unchanged)."""
    args = resolved(digits_flags(digits, batch=64) + MODEL + ['--data-backend', backend])
    net = models.build(Network.of(args))
    net.load_parameters(str(workspace / 'model_best.params'))
    _, loader = train.get_loaders(args, train=False)
    outputs = []
    for batch in contract.batches(loader, 0, 0, loader.num_batches):
        outputs.append(mx.nd.softmax(net(batch.data[0])).asnumpy()[:batch.data[0].shape[0] - batch.pad])
    files = {hashlib.sha256(path.read_bytes()).hexdigest(): str(path)
             for path in (digits / 'images' / 'val').rglob('*.jpg')}
    reader = mx.recordio.MXRecordIO(str(digits / 'rec' / 'val.rec'), 'r')
    order = []
    while (record := reader.read()) is not None:
        order.append(files[hashlib.sha256(mx.recordio.unpack(record)[1]).hexdigest()])
    return dict(zip(order, np.concatenate(outputs)))


def clear(probabilities, margin):
    """Whether the top class leads the second by more than `margin` (an argmax between near-equal scores is
    no test)."""
    top = np.sort(probabilities)
    return top[-1] - top[-2] > margin


@pytest.mark.integration
def test_pred_over_the_validation_folder_gives_val_s_top1(digits, run, predictions, tmp_path):
    """--mode val (on the run's backend, which it chooses) and --mode pred over the same 359 images: image by
    image the same probabilities (within the network's rounding) and the same top class, hence val's top-1."""
    backend, workspace = run
    val = train_py(digits, tmp_path, '--mode', 'val', '--load', workspace / 'model_best.params')
    top1 = json.loads((tmp_path / 'report_val.json').read_text())['summary']['val.accuracy']
    found, log = predictions
    expected = validation_probabilities(digits, workspace, backend)
    assert sorted(found) == sorted(expected) and len(found) == 359
    files = sorted(found)
    pred, validated = np.array([found[f] for f in files]), np.array([expected[f] for f in files])
    difference = np.abs(pred - validated).max()
    print(f'{backend}: pred against validation, largest probability difference {difference:.2g}')
    assert difference < SAME_INPUT
    decided = np.array([clear(p, 2 * SAME_INPUT) for p in validated])
    assert (pred.argmax(1) == validated.argmax(1))[decided].all()
    labels = labels_of(digits, files)
    near_ties = int((~decided).sum())
    assert abs((pred.argmax(1) == labels).mean() - top1) <= near_ties / len(files) + 1e-9, (top1, near_ties)
    assert abs((validated.argmax(1) == labels).mean() - top1) <= near_ties / len(files) + 1e-9
    assert top1 > 0.6
    print(f'{backend}: --mode val top-1 {top1:.4f}, --mode pred top-1 {(pred.argmax(1) == labels).mean():.4f}')
    # The run recorded how it validated; val and pred took it from there and said so.
    recorded = checkpoint.read_state(str(workspace / 'model_last.state')).meta['settings']['val_interpolation']
    assert recorded == ('linear' if backend == 'mxnet' else 'linear-antialias')
    assert f'its validation resize\'s {recorded} interpolation' in val.stderr
    loader = 'ImageRecordIter' if backend == 'mxnet' else 'DALI'
    assert f'Validation with {loader}: shorter side to 28 (the longer rounded down), {recorded} interpolation, ' \
        'centre 24x24 crop' in val.stderr
    assert ('--data-backend mxnet (its validation backend' in val.stderr) == (backend == 'mxnet')
    assert f'{recorded} interpolation, centre 24x24 crop' in log


@pytest.mark.integration
def test_a_dali_run_is_not_validated_by_imagerecorditer(digits, run, tmp_path):
    """ImageRecordIter cannot antialias: --mode val --data-backend mxnet on a run that validated with DALI is one
    error line; a run that validated with ImageRecordIter is validated by DALI, when asked, without antialiasing."""
    backend, workspace = run
    other = 'dali-cpu' if backend == 'mxnet' else 'mxnet'
    flags = ['--mode', 'val', '--load', workspace / 'model_best.params', '--data-backend', other]
    if backend == 'mxnet':
        result = train_py(digits, tmp_path, *flags, check=False)
    else:                                       # refused before anything runs: in this process
        result = train_main(*digits_flags(digits, batch=64), *MODEL, '--workspace', tmp_path, *flags)
    if backend == 'mxnet':
        assert result.returncode == 0, result.stderr[-2000:]
        assert 'Validation with DALI: shorter side to 28 (the longer rounded down), linear interpolation' in \
            result.stderr
    else:
        errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
        assert result.returncode == 2 and len(errors) == 1 and 'Traceback' not in result.stderr
        assert '--data-backend mxnet' in errors[0] and 'cannot' in errors[0]


def snippet_bound():
    """The largest difference the README states between its snippet's probabilities and pred's."""
    with open(README, encoding='utf-8') as f:
        return float(re.search(r"probabilities differ from `--mode pred`'s by at most ([0-9.]+)", f.read()).group(1))


@pytest.mark.integration
def test_export_writes_its_preprocessing_and_the_readme_snippet_gives_pred_s_probabilities(
        digits, run, predictions, tmp_path, monkeypatch):
    """Export writes what the model expects beside it and in report_export.json; the README's own snippet,
    reading it, gives pred's probabilities within the README's bound on every validation image of a 24x24
    model, and pred's class wherever pred's top class leads clearly."""
    backend, workspace = run
    train_py(digits, tmp_path, '--mode', 'export', '--load', workspace / 'model_best.params')
    folder = tmp_path / 'export'
    expects = json.loads((folder / 'model.preprocessing.json').read_text())
    assert json.loads((tmp_path / 'report_export.json').read_text())['summary']['preprocessing'] == expects
    assert expects['size'] == [24, 24] and expects['resize_shorter'] == 28 and expects['layout'] == 'NCHW'
    assert expects['interpolation'] == ('linear' if backend == 'mxnet' else 'linear-antialias')
    assert expects['channels'] == 'RGB' and expects['input_name'] == 'data'
    assert np.allclose(expects['mean'], (123.68, 116.779, 103.939))
    assert np.allclose(expects['std'], (58.393, 57.12, 57.375))

    snippet = next(block for block in code_blocks('python') if '.preprocessing.json' in block)
    snippet = (snippet.replace("'runs/photos/export/model.onnx'", repr(str(folder / 'model.onnx')))
               .replace("'data/photos/classes.json'", repr(str(digits / 'rec' / 'classes.json')))
               .replace("'new_photos/cat.jpg'", 'IMAGE'))
    code = compile(snippet, 'README.md', 'exec')
    import onnxruntime
    sessions = {}
    session = onnxruntime.InferenceSession
    # The snippet loads the model for each image: the same file, loaded once here (setdefault(path, session(path))
    # loaded it again for every image, two minutes of the test).
    monkeypatch.setattr(onnxruntime, 'InferenceSession',
                        lambda path: sessions[path] if path in sessions else sessions.setdefault(path, session(path)))
    found, _ = predictions
    names = [c['name'] for c in json.loads((digits / 'rec' / 'classes.json').read_text())['classes']]
    bound, differences = snippet_bound(), []
    for path, probabilities in sorted(found.items()):
        namespace = {'IMAGE': path}
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            exec(code, namespace)
        logits = namespace['logits'][0].astype(np.float64)
        snippet_probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        differences.append(np.abs(snippet_probabilities - probabilities).max())
        if clear(probabilities, 2 * bound):
            assert printed.getvalue().strip() == names[int(probabilities.argmax())], path
    worst = int(np.argmax(differences))
    print(f'{backend}: README snippet against pred, largest probability difference {differences[worst]:.4f} '
          f'({sorted(found)[worst]}), mean {np.mean(differences):.2g}')
    assert len(differences) == 359 and max(differences) <= bound


def non_square_images(digits, folder):
    """Validation digits resized to non-square sizes (both orientations, odd margins) as JPEG files, and a
    .rec/.idx of the same bytes."""
    folder.mkdir()
    sources = sorted((digits / 'images' / 'val' / 'digit_6').iterdir())[:6]
    paths = []
    writer = mx.recordio.MXIndexedRecordIO(str(folder / 'val.idx'), str(folder / 'val.rec'), 'w')
    for i, (source, size) in enumerate(zip(sources, [(45, 32), (32, 41), (61, 47), (50, 29), (37, 36), (96, 70)])):
        path = folder / f'{i}.jpg'
        Image.open(source).resize(size, Image.BICUBIC).save(path, quality=95)
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, 6, i, 0), path.read_bytes()))
        paths.append(str(path))
    writer.close()
    return paths


@pytest.mark.parametrize('interpolation', ['linear-antialias', 'linear'])
@pytest.mark.unit
def test_every_backend_and_pred_compute_the_same_input(digits, tmp_path, interpolation):
    """On non-square images at 24x24 after a 28 resize: pred's input is the very input of the run's validation
    backend (DALI's graph, or ImageRecordIter's OpenCV), and DALI validates a 'linear' run within one grey level
    of ImageRecordIter; antialiasing matters here (it moves pixels by far more than a level)."""
    paths = non_square_images(digits, tmp_path / 'images')
    flags = digits_flags(digits, batch=6) + MODEL + ['--data-val', str(tmp_path / 'images' / 'val.rec'),
                                                     '--data-val-idx', str(tmp_path / 'images' / 'val.idx')]
    batches = {}
    for backend in ('dali-cpu', 'mxnet'):
        args = resolved(flags + ['--data-backend', backend], val_interpolation=interpolation)
        if backend == 'mxnet' and interpolation == 'linear-antialias':
            with pytest.raises(RecipeError, match='ImageRecordIter cannot'):
                train.get_loaders(args, train=False)
            continue
        _, loader = train.get_loaders(args, train=False)
        batches[backend] = next(loader.epoch(0)).data[0].asnumpy()
        assert batches[backend].shape == (6, 3, 24, 24)
    if interpolation == 'linear-antialias':
        pred = np.concatenate([dali.PredictionImages(contract.Images.of(args)).load(p).asnumpy() for p in paths])
        np.testing.assert_array_equal(pred, batches['dali-cpu'])
        plain = np.concatenate([validation_resize.load_image(p, contract.Images.of(args)).asnumpy() for p in paths])
        assert np.abs(plain - pred).max() * 57 > 5                 # without antialiasing: another input
    else:
        pred = np.concatenate([validation_resize.load_image(p, contract.Images.of(args)).asnumpy() for p in paths])
        np.testing.assert_allclose(pred, batches['mxnet'], atol=1e-5)
        assert np.abs(batches['dali-cpu'] - pred).max() <= 1.01 / 57.12    # one grey level over the smallest std


@pytest.mark.unit
def test_pred_reports_an_unreadable_image_and_goes_on(digits, tmp_path):
    """DALI's prediction pipeline after a file it cannot decode: one error for that file, the next decoded."""
    paths = non_square_images(digits, tmp_path / 'images')
    (tmp_path / 'bad.jpg').write_bytes(b'not an image')
    args = resolved(digits_flags(digits) + MODEL)
    images = dali.PredictionImages(contract.Images.of(args))
    first = images.load(paths[0]).asnumpy()
    with pytest.raises(RecipeError, match='cannot read image .*bad.jpg') as error:
        images.load(str(tmp_path / 'bad.jpg'))
    assert len(str(error.value).splitlines()) == 1 and '[frame' not in str(error.value)
    np.testing.assert_array_equal(images.load(paths[0]).asnumpy(), first)
