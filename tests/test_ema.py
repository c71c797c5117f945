"""ema.py: the weight average (--model-ema, timm's ModelEmaV2 and torchvision's ExponentialMovingAverage) follows
the weights, batchnorm statistics included, and swaps in and out; every N steps with warm-up, against the formula;
torchvision's adjusted decay; each worker's averaged batchnorm statistics in the state. Unit tests on small
networks, then end to end through train.py on the digits set: validated, saved and loadable."""
import json

import mxnet as mx
import numpy as np
import pytest

from rn50.checkpoints import checkpoint
from rn50.training import ema
import train
from rn50.world import workers
from float16_twin import Float16Net, batch_of, step_for
from test_train import epoch_records, run


@pytest.mark.unit
def test_weight_average_follows_the_weights_and_swaps_in_and_out():
    mx.random.seed(1)
    step = step_for(Float16Net(), 'float16')
    average = ema.WeightAverage(step.net, 0.5, mx.cpu())
    start = step.net.weight.data().asnumpy().astype(np.float32)
    rng = np.random.default_rng(0)
    step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), 'float16'), 0, 0, 0.5)
    average.update(1)
    trained = step.net.weight.data().asnumpy().astype(np.float32)
    assert average.average['weight'].dtype == np.float32
    np.testing.assert_allclose(average.average['weight'].asnumpy(), 0.5 * start + 0.5 * trained, rtol=1e-6)
    mean = step.net.bn.running_mean.data().asnumpy()
    assert not np.allclose(mean, 0)                                           # batchnorm statistics too
    np.testing.assert_allclose(average.average['bn.running_mean'].asnumpy(), 0.5 * mean, rtol=1e-6)
    with average.swapped_in():
        np.testing.assert_allclose(step.net.weight.data().asnumpy(), 0.5 * start + 0.5 * trained, rtol=1e-3)
    np.testing.assert_array_equal(step.net.weight.data().asnumpy().astype(np.float32), trained)
    copy = ema.WeightAverage(step.net, 0.5, mx.cpu())
    assert copy.restore(average.state_arrays())
    np.testing.assert_array_equal(copy.average['weight'].asnumpy(), average.average['weight'].asnumpy())


@pytest.mark.parametrize('dtype', ['float32', 'float16'])
@pytest.mark.unit
def test_the_average_every_n_steps_with_warm_up_follows_the_formula(dtype):
    """--model-ema-steps 3 --model-ema-warmup over 7 steps, against the formula written out here: after steps 3
    and 6 only, a = d * a + (1 - d) * w with d = min(0.9, 1 - (1 + step)^(-2/3)) ** 3 (float16 weights go
    through the mixed-precision kernel; the network's own weights are never written)."""
    mx.random.seed(1)
    step = step_for(Float16Net(), dtype,
                    average=lambda net: ema.WeightAverage(net, 0.9, mx.cpu(), every=3, warmup=True))
    step.accumulation.start_epoch(7)
    expected = {name: p.data().asnumpy().astype(np.float64) for name, p in step.net._collect_params_with_prefix().items()}
    rng = np.random.default_rng(0)
    for iteration in range(7):
        step.run(batch_of(rng.normal(size=(8, 4, 2, 2)), rng.integers(0, 3, 8), dtype), 0, iteration, 0.5)
        number = iteration + 1
        if number % 3 == 0:
            decay = min(0.9, 1 - (1 + number) ** (-2 / 3)) ** 3
            for name, p in step.net._collect_params_with_prefix().items():
                expected[name] = decay * expected[name] + (1 - decay) * p.data().asnumpy().astype(np.float64)
    assert step.accumulation.step_number(0, 6) == 7
    for name, value in expected.items():
        np.testing.assert_allclose(step.average.average[name].asnumpy(), value, rtol=2e-5, atol=1e-6)


@pytest.mark.unit
def test_torchvisions_adjusted_decay():
    args = train.build_parser().parse_args(['--model-ema', '--model-ema-decay', '0.99998', '--model-ema-steps',
                                            '32', '--model-ema-adjust', '--batch-size', '1024', '--num-epochs',
                                            '600'])
    assert ema.AverageSettings.of(args).adjusted_decay() == pytest.approx(1 - 2e-5 * 1024 * 32 / 600)
    args.model_ema_decay, args.num_epochs = 0.9998, 1
    assert ema.AverageSettings.of(args).adjusted_decay() == 0       # alpha capped at 1: the average is the weights


class TwoWorkers(workers.Communicator):
    """A stand-in for the collectives of rank 1 of 2 whose rank 0 holds batchnorm statistics 1 larger."""

    def gather(self, row):
        return np.stack([row + 1, row])


@pytest.mark.unit
def test_every_worker_resumes_its_own_averaged_batchnorm_statistics():
    mx.random.seed(1)
    step = step_for(Float16Net())
    average = ema.WeightAverage(step.net, 0.5, mx.cpu())
    average.average['bn.running_mean'][:] = 0.25
    arrays = ema.average_state(average, step.net, workers.World(TwoWorkers(rank=1, size=2)))
    assert arrays['ema:rank0:bn.running_mean'].asnumpy() == pytest.approx([1.25] * 4)
    resumed = ema.WeightAverage(step.net, 0.5, mx.cpu())
    assert resumed.restore(arrays, rank=1)
    assert resumed.average['bn.running_mean'].asnumpy() == pytest.approx([0.25] * 4)
    assert resumed.restore(arrays, rank=0)
    assert resumed.average['bn.running_mean'].asnumpy() == pytest.approx([1.25] * 4)


@pytest.mark.integration
def test_weight_average_is_validated_saved_and_loadable(digits, tmp_path):
    ws = tmp_path / 'ws'
    run(digits, ws, '--num-epochs', '2', '--data-backend', 'mxnet', '--model-ema', '--model-ema-decay', '0.8',
        '--num-examples', '64')
    epochs = epoch_records(ws)
    assert {'val.ema.loss', 'val.ema.accuracy', 'val.ema.top_k_accuracy_5'} <= set(epochs[1]['data'])
    assert epochs[1]['data']['val.ema.loss'] != epochs[1]['data']['val.loss']
    report = json.loads((ws / 'report.json').read_text())
    assert [e['val.ema.accuracy'] for e in report['epochs']] == [e['data']['val.ema.accuracy'] for e in epochs]
    assert report['summary']['val.ema.accuracy'] == max(e['data']['val.ema.accuracy'] for e in epochs)
    state = checkpoint.read_state(str(ws / 'model_last.state'))
    assert set(state.extra) == {'ema:' + name for name in state.params} | {ema.UPDATES_NAME}
    assert state.meta['ema_best_accuracy'] == report['summary']['val.ema.accuracy']
    best_epoch = max(epochs, key=lambda e: e['data']['val.ema.accuracy'])['data']
    run(digits, tmp_path / 'eval', '--mode', 'val', '--data-backend', 'mxnet', '--load', ws / 'model_ema_best.params')
    assert epoch_records(tmp_path / 'eval')[0]['data']['val.accuracy'] == pytest.approx(best_epoch['val.ema.accuracy'])
