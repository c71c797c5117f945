"""schedule.py: the learning rate as a function of the run's progress in epochs, at known points: the linear
warm-up from zero (or none), cosine, cosine segments restarting scaled, poly as MLPerf configures it,
multistep; and the default warm-up shortened to fit a short run."""
import math

import pytest

from rn50.optim import schedule


def lr(progress, **kw):
    options = dict(base_lr=1.0, num_epochs=90, warmup_epochs=5, schedule='cosine', steps=(), factor=0.1)
    options.update(kw)
    return schedule.learning_rate(progress, **options)


@pytest.mark.unit
def test_warmup_is_linear_from_zero():
    assert lr(0) == 0
    assert lr(2.5) == pytest.approx(0.5)
    assert lr(5 - 1e-9) == pytest.approx(1.0)


@pytest.mark.unit
def test_cosine_known_points():
    assert lr(5) == pytest.approx(1.0)
    assert lr(47.5) == pytest.approx(0.5)                      # half way through the cosine span
    assert lr(5 + 85 / 4) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr(90) == 0 and lr(100) == 0


@pytest.mark.unit
def test_cosine_segments_restart_scaled():
    kw = dict(steps=[30, 60], factor=0.5)
    assert lr(30, **kw) == pytest.approx(0.5)                  # segment 1 restarts at base * factor
    assert lr(60, **kw) == pytest.approx(0.25)
    assert lr(45, **kw) == pytest.approx(0.25)                 # middle of segment 1: half of 0.5


@pytest.mark.unit
def test_poly_boundaries_as_mlperf_configures_it():
    """MLPerf's 8-GPU ResNet-50: learning rate 11.0, 2 warm-up epochs, power 2 down to 0.0001 at epoch 37."""
    kw = dict(base_lr=11.0, num_epochs=37, warmup_epochs=2, schedule='poly', power=2.0, end_lr=0.0001)
    assert lr(0, **kw) == 0 and lr(1, **kw) == pytest.approx(5.5)                 # the linear warm-up
    assert lr(2, **kw) == pytest.approx(11.0)                                      # peak right after it
    assert lr(19.5, **kw) == pytest.approx(0.0001 + (11.0 - 0.0001) * 0.25)       # half way: (1/2)^2
    assert lr(37 - 1e-9, **kw) == pytest.approx(0.0001) and lr(37, **kw) == 0.0001 and lr(40, **kw) == 0.0001
    assert lr(36, power=1.0, **{k: v for k, v in kw.items() if k != 'power'}) == pytest.approx(0.0001 + 10.9999 / 35)


@pytest.mark.unit
def test_multistep_known_points():
    kw = dict(schedule='multistep', steps=[30, 60], factor=0.1)
    assert lr(10, **kw) == pytest.approx(1.0)
    assert lr(30, **kw) == pytest.approx(0.1)
    assert lr(59.9, **kw) == pytest.approx(0.1)
    assert lr(60, **kw) == pytest.approx(0.01)
    assert lr(2.5, **kw) == pytest.approx(0.5)


@pytest.mark.unit
def test_no_warmup():
    assert lr(0, warmup_epochs=0) == pytest.approx(1.0)


@pytest.mark.unit
def test_the_default_warm_up_is_shortened_to_fit_a_short_run(caplog):
    """-e 3 with the default 5-epoch warm-up was all warm-up: the rate peaked at 60% of --lr, never decayed."""
    import train
    from rn50.optim.schedule import default_warmup, learning_rate
    args = train.parse_flags(['--num-epochs', '3', '--lr', '1'])[0]
    with caplog.at_level('INFO', logger='rn50.optim.schedule'):
        warmup = default_warmup(args.warmup_epochs, args.num_epochs)
    assert warmup == 1.5 and 'half of the 3-epoch run' in caplog.text
    rates = [learning_rate(e / 10, 1.0, 3, warmup, 'cosine', [], 0.1) for e in range(30)]
    assert max(rates) == pytest.approx(1.0, abs=0.01) and rates[-1] < 0.02     # peaks, then decays to ~0
    args = train.parse_flags(['--num-epochs', '90'])[0]
    assert default_warmup(args.warmup_epochs, args.num_epochs) == 5
