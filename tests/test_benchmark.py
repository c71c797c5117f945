"""benchmark.py: averaging, the JSON report, plots, failed points, and a real CPU sweep."""
import json
import os
import stat
import sys

import pytest

import benchmark

FAKE_RUNNER = '''#!{python}
import json, sys
args = sys.argv[1:]
n, b = int(args[args.index('-n') + 1]), int(args[args.index('-b') + 1])
if b == 13:
    print('runner: something broke', file=sys.stderr)
    sys.exit(3)
if b == 2:
    print("error: training data '/data/imagenet/train.rec' not found", file=sys.stderr)
    sys.exit(2)
path = args[args.index('--dllogger-log') + 1]
with open(path, 'w') as f:
    for epoch, ips in enumerate([10.0, 100.0 * n, 300.0 * n]):
        for data in ({{'train.ips': ips}}, {{'train.epoch_gap': 0.5 * n}}):
            f.write('DLLL ' + json.dumps({{'type': 'LOG', 'step': [epoch], 'data': data}}) + '\\n')
'''


def fake_runner(tmp_path):
    path = tmp_path / 'fake_runner'
    path.write_text(FAKE_RUNNER.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.unit
def test_summary_drops_warmup_and_takes_harmonic_mean():
    records = [{'step': 'PARAMETER', 'data': {}}, {'step': [0, 20], 'data': {'train.ips': 1.0}},
               {'step': [0], 'data': {'train.ips': 10.0, 'val.latency_avg': 1.0}},
               {'step': [1], 'data': {'train.ips': 100.0, 'val.latency_avg': 2.0}},
               {'step': [2], 'data': {'train.ips': 300.0, 'val.latency_avg': 4.0}}, {'step': [], 'data': {}}]
    summary = benchmark.summarise(records, ['train.ips', 'val.latency_avg'], warmup=1)
    assert summary['train.ips'] == pytest.approx(2 / (1 / 100 + 1 / 300))
    assert summary['val.latency_avg'] == pytest.approx(3.0)
    with pytest.raises(ValueError):
        benchmark.summarise(records, ['train.ips'], warmup=3)


@pytest.mark.unit
def test_report_plots_and_failed_point(tmp_path, capsys):
    output = str(tmp_path / 'report.json')
    status = benchmark.main(['--executable', fake_runner(tmp_path), '-o', output, '-n', '1,2', '-b', '8,13',
                             '-e', '3', '-w', '1', '--mode', 'train', '--dtype', 'float32'])
    assert status == 1                                        # some points failed
    text = open(output).read()
    assert 'NaN' not in text
    report = json.loads(text)
    assert report['ngpus'] == [1, 2] and report['bs'] == [8, 13]
    assert report['metric_keys'] == ['train.ips', 'train.epoch_gap']     # the time between epochs beside the speed
    assert report['metrics']['2']['8'] == {'train.ips': pytest.approx(2 / (1 / 200 + 1 / 600)),
                                           'train.epoch_gap': 1.0}
    assert report['metrics']['1']['13'] == {'train.ips': None, 'train.epoch_gap': None}
    failed = report['points']['1']['13']
    assert failed['returncode'] == 3 and 'something broke' in failed['error']
    assert report['points']['1']['8']['command'][-2:] == ['--dtype', 'float32']
    assert {'cpu', 'cpu_count'} <= set(report['hardware']) and 'mxnet' in report['versions']
    for suffix in ('throughput', 'scaling'):
        with open(f'{output}.{suffix}.png', 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    out = capsys.readouterr().out
    assert 'train.ips' in out and 'failed' in out


@pytest.mark.unit
def test_plots_only_what_can_be_shown(tmp_path, capsys):
    """One worker count: no scaling plot; every point failed: no plot at all; each said on stderr."""
    output = str(tmp_path / 'one.json')
    benchmark.main(['--executable', fake_runner(tmp_path), '-o', output, '-n', '1', '-b', '8,16', '-e', '3', '-w',
                    '1', '--mode', 'train'])
    assert os.path.exists(f'{output}.throughput.png') and not os.path.exists(f'{output}.scaling.png')
    assert 'no scaling plot' in capsys.readouterr().err
    output = str(tmp_path / 'failed.json')
    benchmark.main(['--executable', fake_runner(tmp_path), '-o', output, '-n', '1,2', '-b', '13', '-e', '3', '-w',
                    '1', '--mode', 'train'])
    assert not os.path.exists(f'{output}.throughput.png') and not os.path.exists(f'{output}.scaling.png')
    assert 'no plots: every point failed' in capsys.readouterr().err


@pytest.mark.integration
def test_real_cpu_sweep(tmp_path, monkeypatch):
    output = str(tmp_path / 'cpu.json')
    monkeypatch.setenv('PATH', os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    status = benchmark.main(['-o', output, '-n', '1', '-b', '4,8', '-i', '3', '-e', '2', '-w', '1', '--mode',
                             'val', '--data-backend', 'synthetic', '--image-shape', '3,32,32', '--num-layers', '10',
                             '--num-classes', '10'])
    report = json.load(open(output))
    assert status == 0, report['points']
    point = report['metrics']['1']['8']
    assert point['val.ips'] > 0 and point['val.latency_50'] <= point['val.latency_100']
    assert set(point) == set(benchmark.METRICS['val'])


@pytest.mark.integration
def test_val_sweep_with_int8(tmp_path, monkeypatch):
    """benchmark.py forwards the inference options: each point calibrates its INT8 model and times it."""
    output = str(tmp_path / 'int8.json')
    monkeypatch.setenv('PATH', os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    status = benchmark.main(['-o', output, '-n', '1', '-b', '8', '-i', '3', '-e', '2', '-w', '1', '--mode', 'val',
                             '--data-backend', 'synthetic', '--image-shape', '3,32,32', '--num-layers', '10',
                             '--num-classes', '10', '--quantize', 'int8', '--calib-batches', '2'])
    report = json.load(open(output))
    assert status == 0, report['points']
    assert report['metrics']['1']['8']['val.ips'] > 0
    record = json.load(open(os.path.join(output + '.points', '1x8', 'model_int8.json')))
    assert record['calib_batches'] == 2 and record['data'] == 'synthetic'


@pytest.mark.unit
def test_a_user_error_stops_the_sweep_and_an_earlier_sweeps_points_go(tmp_path, capsys):
    """Without ImageNet every point failed alike; now the first user error (exit status 2) ends the sweep. And
    a failed point of an earlier sweep left its folder behind."""
    output = str(tmp_path / 'report.json')
    benchmark.main(['--executable', fake_runner(tmp_path), '-o', output, '-n', '1', '-b', '13', '-e', '3', '-w', '1',
                    '--mode', 'train'])
    assert os.path.isdir(f'{output}.points/1x13')
    status = benchmark.main(['--executable', fake_runner(tmp_path), '-o', output, '-n', '1,2', '-b', '2,8', '-e', '3',
                             '-w', '1', '--mode', 'train'])
    err = capsys.readouterr().err
    assert status == 1 and "error: exit status 2: error: training data '/data/imagenet/train.rec' not found" in err
    assert 'the sweep stopped at its first point' in err
    assert sorted(os.listdir(f'{output}.points')) == ['1x2']
