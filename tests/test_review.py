"""rn50/review/: what a model learned. The figures against a hand count and scikit-learn, the gathering of every
worker's outcomes (padding, uneven shards, every worker seeing every image), the calibration and its 95% threshold,
the pictures decoded with Pillow, the page; the review of a real run (trained_digits) read back, its worst images
predicted by --mode pred, the first training batch of each CPU backend, 1 and 2 workers' counts equal, and the page
rendered by headless Chromium with every image decoded."""
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, TRAINED_NET, copy_workspace, digits_flags, run_mode, two_gloo_workers

from rn50.errors import RecipeError
from rn50.review import outcomes, page, pictures
from rn50.world import workers


def log_probabilities(probabilities):
    return np.log(np.asarray(probabilities, np.float64))


# A hand-counted set: 3 classes, 8 images.
#   record  label  probabilities        top-1
#   0       0      .7 .2 .1             0
#   1       0      .3 .6 .1             1
#   2       0      .5 .1 .4             0
#   3       1      .1 .8 .1             1
#   4       1      .2 .2 .6             2
#   5       2      .1 .1 .8             2
#   6       2      .6 .3 .1             0
#   7       2      .2 .3 .5             2
LABELS = [0, 0, 0, 1, 1, 2, 2, 2]
PROBABILITIES = [[.7, .2, .1], [.3, .6, .1], [.5, .1, .4], [.1, .8, .1], [.2, .2, .6], [.1, .1, .8], [.6, .3, .1],
                 [.2, .3, .5]]
NAMES = ['cat', 'dog', 'fox']


def hand_table():
    table = outcomes.OutcomeTable(8)
    table.add(range(8), LABELS, log_probabilities(PROBABILITIES))
    return table


@pytest.mark.unit
def test_per_class_figures_and_confusion_match_a_hand_count():
    review = outcomes.review_figures(hand_table(), NAMES, worst_count=3)
    assert outcomes.confusion_matrix(review).tolist() == [[2, 1, 0], [0, 1, 1], [1, 0, 2]]
    cat, dog, fox = review['per_class']
    # cat: 2 of its 3 images right (recall 2/3); 3 images called cat, 2 of them cats (precision 2/3)
    assert (cat['name'], cat['support'], cat['precision'], cat['recall']) == ('cat', 3, pytest.approx(2 / 3),
                                                                              pytest.approx(2 / 3))
    assert (dog['precision'], dog['recall'], dog['top1']) == (pytest.approx(1 / 2), pytest.approx(1 / 2),
                                                              pytest.approx(1 / 2))
    assert fox['precision'] == pytest.approx(2 / 3) and fox['f1'] == pytest.approx(2 / 3)
    assert [c['top5'] for c in review['per_class']] == [1.0, 1.0, 1.0]       # 3 classes: all within the top 5
    assert review['top1'] == pytest.approx(5 / 8)
    assert review['loss'] == pytest.approx(-np.mean(np.log([.7, .3, .5, .8, .2, .8, .1, .5])))
    assert [(m['true_name'], m['predicted_name'], m['images']) for m in review['most_confused']] == \
        [('cat', 'dog', 1), ('dog', 'fox', 1), ('fox', 'cat', 1)]
    # the highest losses: record 6 (p(true) .1), then 4 (.2), then 1 (.3)
    assert [(w['record'], w['true_name'], w['predicted_name']) for w in review['worst']] == \
        [(6, 'fox', 'cat'), (4, 'dog', 'fox'), (1, 'cat', 'dog')]
    assert review['worst'][0]['predicted_probability'] == pytest.approx(.6)
    assert review['worst'][0]['true_probability'] == pytest.approx(.1)


@pytest.mark.unit
def test_per_class_figures_equal_scikit_learns_on_a_larger_set():
    from sklearn import metrics
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 30, 2000)
    logits = rng.normal(size=(2000, 30)) + 3 * np.eye(30)[labels]
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    table = outcomes.OutcomeTable(2000)
    table.add(range(2000), labels, log_p)
    review = outcomes.review_figures(table, [f'c{i}' for i in range(30)])
    predicted = log_p.argmax(axis=1)
    precision, recall, f1, support = metrics.precision_recall_fscore_support(labels, predicted, labels=range(30),
                                                                              zero_division=0)
    assert [c['precision'] for c in review['per_class']] == pytest.approx(precision)
    assert [c['recall'] for c in review['per_class']] == pytest.approx(recall)
    assert [c['f1'] for c in review['per_class']] == pytest.approx(f1)
    assert [c['support'] for c in review['per_class']] == list(support)
    assert (outcomes.confusion_matrix(review) == metrics.confusion_matrix(labels, predicted, labels=range(30))).all()
    assert review['top5'] == pytest.approx(metrics.top_k_accuracy_score(labels, log_p, k=5, labels=range(30)))


class SummingComm:
    """Two workers' all-reduce in one process: the sum of what each gives (the other's rows set beforehand)."""

    def __init__(self, other):
        self.other = other

    def allreduce_sum(self, values):
        return np.asarray(values, np.float64) + self.other


@pytest.mark.unit
def test_two_workers_rows_give_one_workers_table_and_a_missed_image_is_an_error():
    whole = hand_table()
    first, second = outcomes.OutcomeTable(8), outcomes.OutcomeTable(8)
    first.add(range(0, 5), LABELS[:5], log_probabilities(PROBABILITIES[:5]))    # an uneven split: 5 and 3
    second.add(range(5, 8), LABELS[5:], log_probabilities(PROBABILITIES[5:]))
    gathered = first.gathered(SummingComm(second.rows.ravel()))
    assert np.array_equal(gathered.rows, whole.gathered(workers.Communicator()).rows)
    # --dali-separ-val: every worker sees every image; each row is the mean of identical copies
    both = whole.gathered(SummingComm(hand_table().rows.ravel()))
    assert np.allclose(both.rows, whole.rows)
    with pytest.raises(RecipeError, match='no outcome for 3 of 8 images .*record 5'):
        first.gathered(workers.Communicator())


@pytest.mark.unit
def test_calibration_error_bins_and_the_95_percent_threshold():
    confidence = np.array([.95, .95, .92, .85, .85, .6, .55, .3])
    correct = np.array([1, 1, 1, 1, 0, 1, 0, 0], np.float64)
    result = outcomes.calibration(confidence, correct, bins=10)
    bins = result['reliability']
    assert [b['images'] for b in bins] == [0, 0, 1, 0, 0, 2, 0, 0, 2, 3]      # (lower, upper]: .3 in (.2, .3]
    assert bins[9]['accuracy'] == 1.0 and bins[9]['confidence'] == pytest.approx(0.94)
    expected = (3 * abs(1 - 0.94) + 2 * abs(0.5 - 0.85) + 2 * abs(0.5 - .575) + abs(0 - .3)) / 8
    assert result['ece'] == pytest.approx(expected)
    # right 3 of 3 from 0.92 up; from 0.85 (both images of that confidence) 4 of 5: the threshold is 0.92
    assert result['trusted_from'] == {'confidence': .92, 'images': 3, 'share': 3 / 8, 'accuracy': 1.0}
    never = outcomes.calibration(np.array([.9, .8]), np.array([0.0, 1.0]))
    assert never['trusted_from'] is None


def decoded(data):
    from PIL import Image
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def not_blank(image):
    pixels = np.asarray(image.convert('L'), np.float64)
    return pixels.std() > 5


@pytest.mark.unit
def test_pictures_decode_as_images_of_their_size_and_are_not_blank():
    review = outcomes.review_figures(hand_table(), NAMES + [])
    for data in (pictures.class_accuracy_png([c['top1'] for c in review['per_class']]),
                 pictures.reliability_png(review['calibration']),
                 pictures.confusion_png(outcomes.confusion_matrix(review), ['a $x^2$ cat', 'Hündchen', 'fox_{1}']),
                 pictures.curves_png([(0.5, {'train.loss': 2.0, 'train.lr': 0.1}), (1.0, {'train.loss': 1.5})],
                                     [{'epoch': 0, 'train.loss': 1.7, 'val.loss': 1.6, 'val.accuracy': 0.4}])):
        image = decoded(data)
        assert image.format == 'PNG' and min(image.size) >= 300 and not_blank(image)
    tiles = [np.full((24, 32, 3), 40 * n, np.uint8) for n in range(5)]
    sheet = decoded(pictures.sheet_jpeg(tiles, [['photo ä.jpg', 'true: Hündchen 2.0%']] * 5))
    assert sheet.format == 'JPEG' and sheet.size == (4 * (pictures.TILE + 8), 2 * (pictures.TILE + 8 + 2 * 13))
    assert not_blank(sheet)


@pytest.mark.unit
def test_a_picture_that_cannot_be_drawn_is_one_warning(caplog):
    def broken():
        raise ValueError('no font here\nsecond line')
    assert pictures.drawn('the test picture', broken) is None
    assert caplog.messages == ['Could not draw the test picture (ValueError: no font here); its figures are in the '
                               'report\'s JSON']


@pytest.mark.unit
def test_displayable_undoes_the_normalisation_in_either_layout():
    mean, std = (123.68, 116.779, 103.939), (58.393, 57.12, 57.375)
    picture = np.random.default_rng(1).integers(0, 256, (2, 5, 6, 3)).astype(np.float32)
    normalised = (picture - np.array(mean, np.float32)) / np.array(std, np.float32)
    nchw = np.concatenate([normalised.transpose(0, 3, 1, 2), np.zeros((2, 1, 5, 6), np.float32)], axis=1)
    assert np.array_equal(pictures.displayable(nchw.astype(np.float16), mean, std, 'NCHW'),
                          pictures.displayable(normalised, mean, std, 'NHWC'))
    assert np.abs(pictures.displayable(normalised, mean, std, 'NHWC').astype(int) - picture).max() <= 1


@pytest.mark.unit
def test_the_page_of_a_thousand_classes_shows_pairs_and_a_histogram_not_a_matrix():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 1000, 5000)
    logits = rng.normal(size=(5000, 1000)) + 4 * np.eye(1000)[labels]
    table = outcomes.OutcomeTable(5000)
    table.add(range(5000), labels, logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)))
    review = outcomes.review_figures(table, [f'class <{i}>' for i in range(1000)])
    html = page.page_html(page.Page('ImageNet <review>', (('top-1', '1%'),), review, {'class_accuracy': b'\x89PNG'}))
    assert 'Confusion matrix' not in html and 'Most confused' in html and 'All 1000 classes' in html
    assert 'ImageNet &lt;review&gt;' in html and 'class &lt;7&gt;' in html and '<review>' not in html
    assert len(review['most_confused']) == outcomes.MOST_CONFUSED
    assert sum(n for _, _, n in review['confusion']) == 5000


# --------------------------------------------------------------------------------------------------------
# The review of real runs


def page_images(html):
    """{alt text: decoded Pillow image} of the data: URIs of a page."""
    return {alt: decoded(base64.b64decode(data)) for alt, data in
            re.findall(r'<img alt="([^"]*)" src="data:image/(?:png|jpeg);base64,([^"]+)"', html)}


@pytest.mark.integration
def test_a_training_run_reviews_its_best_weights(trained_digits):
    """trained_digits (ResNet-10, 3 epochs, mxnet backend): report.json's review is of model_best.params, the epoch
    of the best top-1, whose figures it repeats; report.html holds every picture; train_batch.jpg shows 16 crops."""
    report = json.loads((trained_digits / 'report.json').read_text())
    review, summary = report['review'], report['summary']
    assert review['weights'].endswith('model_best.params') and review['epoch'] == summary['val.accuracy.epoch']
    assert review['images'] == 359 and review['top1'] == pytest.approx(summary['val.accuracy'], abs=1e-9)
    assert review['top5'] == pytest.approx(summary['val.top_k_accuracy_5'], abs=1e-9)
    assert sum(n for _, _, n in review['confusion']) == 359 == sum(c['support'] for c in review['per_class'])
    assert [c['name'] for c in review['per_class']][:3] == ['zero', 'one', 'two']    # from classes.json
    assert len(review['worst']) == 16 and all(re.fullmatch(r'digit_\d/\d{4}\.jpg', w['file']) for w in review['worst'])
    assert review['calibration']['bins'] == 15 and 0 <= review['calibration']['ece'] < 1
    html = (trained_digits / 'report.html').read_text()
    images = page_images(html)
    assert set(images) == {'loss, accuracy, learning rate and images/s per epoch', 'the confusion matrix',
                           'per-class accuracy', 'the worst validation images', 'the reliability diagram',
                           'the first training batch'}
    assert all(not_blank(image) for image in images.values())
    worst = images['the worst validation images']
    assert worst.size == (4 * (pictures.TILE + 8), 4 * (pictures.TILE + 8 + 3 * 13))
    batch = decoded((trained_digits / 'train_batch.jpg').read_bytes())
    assert batch.size == (4 * (pictures.TILE + 8), 4 * (pictures.TILE + 8 + 13)) and not_blank(batch)


@pytest.mark.integration
def test_the_worst_images_are_what_pred_predicts_on_their_files(digits, trained_digits, tmp_path):
    workspace = copy_workspace(trained_digits, tmp_path / 'run')
    worst = json.loads((workspace / 'report.json').read_text())['review']['worst']
    files = tmp_path / 'worst'
    files.mkdir()
    for n, image in enumerate(worst):
        shutil.copy(digits / 'images' / 'val' / image['file'], files / f'{n:02d}.jpg')
    run_mode(*digits_flags(digits, batch=32), *TRAINED_NET, '--workspace', workspace, '--mode', 'pred',
             '--data-pred', files, '--pred-output', tmp_path / 'pred.json')
    predictions = json.loads((tmp_path / 'pred.json').read_text())['predictions']
    assert [p['top'][0]['name'] for p in predictions] == [w['predicted_name'] for w in worst]
    assert [p['top'][0]['probability'] for p in predictions] == \
        pytest.approx([w['predicted_probability'] for w in worst], abs=1e-4)


@pytest.mark.integration
def test_val_reviews_any_weights_with_the_classes_names(digits, trained_digits, tmp_path):
    """--mode val --load, in a workspace of its own: report_val.json's review of those weights (their epoch from
    their run's report.json) with the names of --classes (spaces, an umlaut, TeX and HTML characters),
    report_val.html escapes them."""
    names = tmp_path / 'names.txt'
    names.write_text('\n'.join(['null <0>', 'eins & $x^2$', 'zwei Hündchen'] + [f'digit {n}' for n in range(3, 10)]))
    workspace = tmp_path / 'val'
    result = run_mode(*digits_flags(digits, batch=32), *TRAINED_NET, '--workspace', workspace, '--mode', 'val',
                      '--load', trained_digits / 'model_best.params', '--classes', names, '--review-worst', '5')
    assert 'What the model learned' in result.stderr
    review = json.loads((workspace / 'report_val.json').read_text())['review']
    best_epoch = json.loads((trained_digits / 'report.json').read_text())['summary']['val.accuracy.epoch']
    assert review['weights'] == str(trained_digits / 'model_best.params') and review['epoch'] == best_epoch
    assert [c['name'] for c in review['per_class']][:3] == ['null <0>', 'eins & $x^2$', 'zwei Hündchen']
    assert len(review['worst']) == 5
    html = (workspace / 'report_val.html').read_text(encoding='utf-8')
    assert 'null &lt;0&gt;' in html and 'eins &amp; $x^2$' in html and 'zwei Hündchen' in html
    assert set(page_images(html)) == {'the confusion matrix', 'per-class accuracy', 'the worst validation images',
                                      'the reliability diagram'}


@pytest.mark.integration
def test_a_review_that_fails_leaves_the_run_and_its_report(digits, trained_digits, tmp_path, monkeypatch):
    from rn50.review import compose

    def broken(*args):
        raise OSError('the disk went away')
    monkeypatch.setattr(compose, 'validation_review', broken)
    workspace = tmp_path / 'val'
    result = run_mode(*digits_flags(digits, batch=32), *TRAINED_NET, '--workspace', workspace, '--mode', 'val',
                      '--load', trained_digits / 'model_best.params')
    assert result.returncode == 0
    assert f'No review of this run (OSError: the disk went away); its results are in {workspace}' in result.stderr
    report = json.loads((workspace / 'report_val.json').read_text())
    assert 'review' not in report and report['summary']['val.accuracy'] > 0.5
    assert not (workspace / 'report_val.html').exists()


@pytest.mark.integration
def test_the_first_training_batch_of_dali_cpu_and_a_page_without_validation(digits, tmp_path):
    """--mode train with dali-cpu: train_batch.jpg from the batch DALI augmented (16 labelled crops); report.html
    shows the curves and the batch and says that no validation ran."""
    workspace = tmp_path / 'train'
    run_mode(*digits_flags(digits, batch=16), '--num-layers', '10', '--data-backend', 'dali-cpu', '--mode', 'train',
             '--num-epochs', '1', '--num-examples', '64', '--workspace', workspace)
    batch = decoded((workspace / 'train_batch.jpg').read_bytes())
    assert batch.size == (4 * (pictures.TILE + 8), 4 * (pictures.TILE + 8 + 13)) and not_blank(batch)
    html = (workspace / 'report.html').read_text()
    assert set(page_images(html)) == {'loss, accuracy, learning rate and images/s per epoch',
                                      'the first training batch'}
    assert 'No validation ran' in html
    assert 'review' not in json.loads((workspace / 'report.json').read_text())


@pytest.mark.integration
@pytest.mark.parametrize('backend', ['mxnet', 'dali-cpu'])
def test_every_validation_image_has_one_place_in_the_shards_of_three_workers(digits, backend):
    """The record positions the validation batches carry (their `index`), padding left out, over the shards of 3
    workers: 359 images split unevenly (120, 120, 119 or 119, 120, 120), each last batch padded; every image
    once."""
    from conftest import resolved
    import train
    args = resolved([*digits_flags(digits, batch=48), '--data-backend', backend])
    seen = []
    for rank in range(3):
        _, loader = train.get_loaders(args, rank, 3, train=False)
        for batch in loader.epoch(0):
            seen += list(batch.index[:len(batch.index) - batch.pad])
            assert len(batch.index) == 16
    assert sorted(seen) == list(range(359))


@pytest.mark.skipif(shutil.which('horovodrun') is None, reason='horovodrun not installed')
@pytest.mark.multiworker
def test_two_workers_count_what_one_worker_counts(digits, trained_digits, tmp_path):
    """--mode val of the same weights by 1 and 2 workers (ImageRecordIter's split of 359 images: 180 and 179, the
    last batches padded): the same counts, image by image."""
    common = [*digits_flags(digits, batch=32), *TRAINED_NET, '--mode', 'val', '--load',
              trained_digits / 'model_best.params']
    for backend in ('mxnet',):
        one, two = tmp_path / f'one-{backend}', tmp_path / f'two-{backend}'
        run_mode(*common, '--data-backend', backend, '--workspace', one)
        result = subprocess.run(two_gloo_workers(sys.executable, os.path.join(ROOT, 'train.py'), *common,
                                                 '--data-backend', backend, '--workspace', two, '--kv-store',
                                                 'horovod'), capture_output=True, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS='1'), timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        alone, both = (json.loads((folder / 'report_val.json').read_text()) for folder in (one, two))
        assert both['workers'] == 2 and both['review']['images'] == alone['review']['images'] == 359
        assert both['review']['confusion'] == alone['review']['confusion']
        assert [w['record'] for w in both['review']['worst']] == [w['record'] for w in alone['review']['worst']]
        assert [w['loss'] for w in both['review']['worst']] == \
            pytest.approx([w['loss'] for w in alone['review']['worst']], rel=1e-4)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which('chromium') is None, reason='no chromium (Debian\'s package; .ci/run installs it)')
def test_chromium_renders_the_page_with_every_image(trained_digits, tmp_path):
    """Headless Chromium opens report.html offline; a script added to a copy counts the images it decoded (their
    natural sizes) and those it could not."""
    html = (trained_digits / 'report.html').read_text()
    probe = ('<script>window.addEventListener("load", () => { const sizes = [...document.images].map(i => '
             'i.complete && i.naturalWidth > 0 ? i.naturalWidth + "x" + i.naturalHeight : "broken"); '
             'document.body.setAttribute("data-images", sizes.join(" ")); });</script>')
    copy = tmp_path / 'report.html'
    copy.write_text(html.replace('</body>', probe + '</body>'))
    result = subprocess.run(['chromium', '--headless', '--no-sandbox', '--disable-gpu', '--virtual-time-budget=5000',
                             '--dump-dom', copy.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'data-images="([^"]*)"', result.stdout)
    assert found, result.stderr[-2000:]
    sizes = found.group(1).split()
    assert len(sizes) == len(page_images(html)) == 6 and 'broken' not in sizes
    assert sizes == [f'{w}x{h}' for w, h in (image.size for image in page_images(html).values())]


@pytest.mark.integration
def test_the_confusion_snippet_of_runs_md_runs_as_printed(trained_digits):
    """docs/runs.md's Python block that builds the matrix from report.json, run on trained_digits' report (its path
    alone replaced): the matrix of outcomes.confusion_matrix."""
    text = open(os.path.join(ROOT, 'docs', 'runs.md'), encoding='utf-8').read()
    block = next(b for b in re.findall(r'```python\n(.*?)```', text, flags=re.S) if "review['confusion']" in b)
    report = trained_digits / 'report.json'
    namespace = {}
    exec(compile(block.replace("'runs/demo/report.json'", repr(str(report))), 'runs.md', 'exec'), namespace)
    review = json.loads(report.read_text())['review']
    assert (namespace['matrix'] == outcomes.confusion_matrix(review)).all() and namespace['matrix'].sum() == 359
