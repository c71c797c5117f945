"""Short runs on the digits set (issue 37, items 4, 8 and 9b): a weight average that has not moved yet is neither
validated nor saved, and a run too short for its schedule says so at the start; a run continued from another
workspace's state summarises its own epochs; --mode val on a small set reads it in a batch of its size."""
import dataclasses
import json
import logging

import mxnet as mx
import pytest

from rn50.checkpoints import checkpoint
from rn50.training import ema
from rn50.training.history import training_summary
from rn50.reports import logs
from float16_twin import Float16Net, step_for
from conftest import built_once, copy_workspace
from test_train import epoch_records, run

# Two validations of the same weights may round one near tie differently: one of the 359 validation digits.
ONE_IMAGE = 1.01 / 359

# 64 training images at -b 32: 2 optimizer steps an epoch.
SHORT = ['--num-examples', '64', '--data-backend', 'mxnet']


def log_text(workspace):
    return (workspace / 'log.log').read_text()


# ---- the weight average -----------------------------------------------------------------------------------

@pytest.mark.integration
def test_a_run_shorter_than_the_average_period_warns_and_never_judges_the_untrained_average(digits, tmp_path):
    """-e 1 of 2 steps with --model-ema-steps 3: the average would first move after step 3. The start says so
    with the numbers; the epoch's validation leaves the average out (once, said), and no model_ema_best.params
    holds the untrained weights."""
    ws = tmp_path / 'ws'
    run(digits, ws, *SHORT, '--num-epochs', '1', '--model-ema', '--model-ema-steps', '3')
    text = log_text(ws)
    assert ('--model-ema-steps 3: the weight average is first updated after optimizer step 3, and this run has 2 '
            'optimizer steps in all (1 epochs of 2)') in text and 'Give --model-ema-steps 2 or less' in text
    assert text.count('The weight average has not been updated yet') == 1
    assert '[Epoch 0] The weight average has not been updated yet (first after optimizer step 3' in text
    assert not any(key.startswith('val.ema.') for key in epoch_records(ws)[0]['data'])
    assert 'val.accuracy' in epoch_records(ws)[0]['data']
    assert not (ws / 'model_ema_best.params').exists()
    assert not any(key.startswith('val.ema.') for key in json.loads((ws / 'report.json').read_text())['summary'])


@pytest.mark.integration
def test_the_average_is_judged_from_the_epoch_of_its_first_update(digits, tmp_path):
    """-e 2 of 2 steps with --model-ema-steps 3: epoch 0 (steps 1-2) has no update, epoch 1 (step 3) one: only
    epoch 1 has val.ema.* and writes model_ema_best.params; the state counts the update; no start warning."""
    ws = tmp_path / 'ws'
    run(digits, ws, *SHORT, '--num-epochs', '2', '--model-ema', '--model-ema-steps', '3')
    epochs = epoch_records(ws)
    assert not any(key.startswith('val.ema.') for key in epochs[0]['data'])
    assert 'val.ema.accuracy' in epochs[1]['data']
    text = log_text(ws)
    assert text.count('The weight average has not been updated yet') == 1 and 'is first updated after' not in text
    assert (ws / 'model_ema_best.params').exists()
    summary = json.loads((ws / 'report.json').read_text())['summary']
    assert summary['val.ema.accuracy'] == epochs[1]['data']['val.ema.accuracy'] and summary['val.ema.accuracy.epoch'] == 1
    state = checkpoint.read_state(str(ws / 'model_last.state'))
    assert state.extra[ema.UPDATES_NAME].asnumpy().tolist() == [1.0]


@pytest.mark.unit
def test_the_update_count_survives_a_resume():
    step = step_for(Float16Net())
    average = ema.WeightAverage(step.net, 0.5, mx.cpu(), every=2)
    average.update(1)
    assert average.updates == 0 and average.last_step == 1
    average.update(2)
    assert average.updates == 1
    resumed = ema.WeightAverage(step.net, 0.5, mx.cpu(), every=2)
    assert resumed.restore(average.state_arrays()) and resumed.updates == 1
    fresh = ema.WeightAverage(step.net, 0.5, mx.cpu(), every=2)
    assert fresh.restore({}) is False and fresh.updates == 0
    older = {name: value for name, value in average.state_arrays().items() if name != ema.UPDATES_NAME}
    assert resumed.restore(older) and resumed.updates == 1       # a state of an earlier version: taken as updated


@pytest.mark.unit
def test_an_average_that_would_only_copy_the_weights_is_warned(caplog):
    """--model-ema-adjust copies the weights at every update made within the warm-up (torchvision's rule): with 4
    steps, an update every 2 and 1 warm-up epoch of 2 steps, the last update (step 4) follows one at step 2,
    within the warm-up, so every update copies; with half an epoch of warm-up the update at step 4 averages."""
    args = ema.AverageSettings(every=2, num_epochs=2, adjust=True, warmup_epochs=1)
    with caplog.at_level(logging.INFO, logger='rn50.training.ema'):
        ema.check_average_schedule(args, 1, 2)
    assert 'every update of the weight average (every 2 steps) comes within or right after the 1 warm-up' in caplog.text
    caplog.clear()
    args = dataclasses.replace(args, warmup_epochs=0.5)
    with caplog.at_level(logging.INFO, logger='rn50.training.ema'):
        ema.check_average_schedule(args, 1, 2)
    assert caplog.text == ''


@pytest.mark.unit
def test_an_average_that_would_stay_mostly_its_starting_weights_is_warned(caplog):
    """A constant decay of 0.9998 spans about 5,000 steps: over a run of 4 the average keeps 99.9% of its starting
    weights, which val.ema.* would report as the average's: warned, with the decay that leaves at most 10%
    (0.1 ** (1/4) = 0.5623). Decay 0.5 keeps 6% (no warning); timm's warm-up of the decay needs none."""
    args = ema.AverageSettings(every=1, num_epochs=2, adjust=False, warmup=False, decay=0.9998, warmup_epochs=0)
    with caplog.at_level(logging.INFO, logger='rn50.training.ema'):
        ema.check_average_schedule(args, 1, 2)
    assert ('--model-ema-decay 0.9998 spans about 5000 optimizer steps and this run has 4 optimizer steps in all '
            '(2 epochs of 2): at its end the weight average is still 100% its starting weights') in caplog.text
    assert '--model-ema-warmup' in caplog.text and '--model-ema-decay 0.5623 or lower' in caplog.text
    for changes in ({'decay': 0.5}, {'warmup': True}):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger='rn50.training.ema'):
            ema.check_average_schedule(dataclasses.replace(args, **changes), 1, 2)
        assert caplog.text == '', changes


# ---- a finished run continued in a new workspace ----------------------------------------------------------

def doctor_best(state_path, accuracy):
    """The state's history and best accuracy set to `accuracy` (checksum redone): an earlier best the continued
    run cannot beat, so that a summary of the whole history and one of this workspace's epochs differ."""
    arrays = mx.nd.load(str(state_path))
    meta = json.loads(arrays['meta'].asnumpy().tobytes().decode())
    for entry in meta['history']:
        entry['val.accuracy'] = accuracy
    meta['best_accuracy'] = accuracy
    arrays['meta'] = checkpoint.bytes_array(json.dumps(meta).encode())
    arrays['checksum'] = checkpoint.bytes_array(checkpoint.checksum(arrays).encode())
    mx.nd.save(str(state_path), arrays)


@pytest.fixture(scope='module')
def continued(digits, tmp_path_factory):
    """A 1-epoch run whose state says top-1 0.999, continued to 2 epochs in another workspace (made once for the
    whole run: tests read it), and the continued run's standard output."""
    def build(root):
        run(digits, root / 'old', *SHORT, '--num-epochs', '1')
        doctor_best(root / 'old' / 'model_last.state', 0.999)
        result = run(digits, root / 'new', *SHORT, '--num-epochs', '2', '--load', root / 'old' / 'model_last.state')
        (root / 'stdout.txt').write_text(result.stdout)
    root = built_once(tmp_path_factory, 'short-runs-continued', build)
    return root / 'old', root / 'new', (root / 'stdout.txt').read_text()


@pytest.mark.integration
def test_a_continued_run_summarises_the_epochs_of_its_own_workspace(continued):
    old, new, stdout = continued
    report = json.loads((new / 'report.json').read_text())
    own = report['epochs'][1]
    assert report['epochs'][0]['inherited_from'] == str(old) and 'inherited_from' not in own
    summary = report['summary']
    assert summary['val.accuracy'] == own['val.accuracy'] < 0.999 and summary['val.accuracy.epoch'] == 1
    assert summary['train.loss.epoch'] == 1 and summary['inherited_epochs'] == 1
    assert 'best_accuracy' not in summary
    assert f'val.accuracy : {logs.format_value(own["val.accuracy"])}' in stdout.split('Summary:')[1]
    assert (f'The summary is of the epochs trained in this workspace, as its model_best.params: epochs 0-0 were '
            f'trained in {old}') in log_text(new)
    assert checkpoint.read_state(str(new / 'model_last.state')).meta['best_accuracy'] == own['val.accuracy']


@pytest.mark.unit
def test_the_summary_leaves_inherited_epochs_out():
    history = [{'epoch': 0, 'train.loss': 1.0, 'val.accuracy': 0.9, 'inherited_from': '/old'},
               {'epoch': 1, 'train.loss': 2.0, 'val.accuracy': 0.5}]
    summary = training_summary(history)
    assert summary == {'inherited_epochs': 1, 'train.loss': 2.0, 'train.loss.epoch': 1, 'val.accuracy': 0.5,
                       'val.accuracy.epoch': 1}
    assert 'inherited_epochs' not in training_summary(history[1:])


# ---- --mode val on a small set ----------------------------------------------------------------------------

@pytest.mark.integration
def test_validation_of_a_small_set_takes_a_batch_of_its_size(continued, digits, tmp_path):
    """--batch-size 1024 on the 359 validation digits: one batch of 359, said once, no padding warning; the
    same top-1 as the run's own validation of those weights."""
    new = copy_workspace(continued[1], tmp_path / 'new')
    result = run(digits, new, '--mode', 'val', '--data-backend', 'mxnet', batch=1024)
    text = log_text(new)
    assert ('--batch-size 1024 is over twice the 359 validation images: validating with a batch of 359 instead '
            '(no padding to compute)') in text
    assert 'padding;' not in text and 'is padding' not in result.stderr
    top1 = json.loads((new / 'report_val.json').read_text())['summary']['val.accuracy']
    assert top1 == pytest.approx(json.loads((new / 'report.json').read_text())['epochs'][1]['val.accuracy'],
                                 abs=ONE_IMAGE)
