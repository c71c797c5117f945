"""logs.py: the DLLogger format and the steady-state timing."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

from rn50.reports import logs


@pytest.mark.unit
def test_dllogger_records(tmp_path, capsys):
    path = tmp_path / 'dll.log'
    logger = logs.DLLogger(str(path))
    logger.log('PARAMETER', {'lr': 0.1})
    logger.log((0, 20), {'train.loss': 2.5, 'train.ips': 100.0})
    logger.log((0,), {'val.accuracy': 0.5})
    logger.log((), {'val.accuracy': 0.5})
    logger.close()
    lines = path.read_text().splitlines()
    assert all(line.startswith('DLLL {') for line in lines)
    records = [json.loads(line[5:]) for line in lines]
    metadata = [r for r in records if r['type'] == 'METADATA']
    assert {'metric': 'train.ips', 'metadata': {'unit': 'images/s'}}.items() <= \
        next(r for r in metadata if r['metric'] == 'train.ips').items()
    entries = [r for r in records if r['type'] == 'LOG']
    assert [r['step'] for r in entries] == ['PARAMETER', [0, 20], [0], []]
    for r in entries:
        assert isinstance(r['timestamp'], str) and isinstance(r['elapsedtime'], str)
        assert len(r['datetime']) == len('2024-01-01 00:00:00.000000')
    assert logs.read_dllogger(str(path))[1]['data'] == {'train.loss': 2.5, 'train.ips': 100.0}
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith('DLL ') and out[1].endswith('- Epoch: 0 Iteration: 20 train.loss : 2.5 '
                                                           'train.ips : 100 images/s')
    assert out[3].endswith('- Summary: val.accuracy : 0.5')


@pytest.mark.unit
def test_steady_durations_drop_warmup():
    assert logs.steady_durations([9.0]) == [9.0]
    assert logs.steady_durations([9.0, 1, 1]) == [1, 1]
    assert len(logs.steady_durations([1.0] * 50)) == 45
    assert len(logs.steady_durations([1.0] * 5000)) == 4900


@pytest.mark.unit
def test_duration_text_reads_at_a_glance():
    assert [logs.duration_text(s) for s in (7.4, 250, 3900, 36000)] == ['7 s', '4 min 10 s', '1 h 05 min',
                                                                         '10 h 00 min']


@pytest.mark.integration
def test_the_peak_memory_is_the_programs_own_not_its_parents():
    """A program started by a large process (a benchmark, a test worker) reports its own peak: getrusage kept
    the parent's from before the exec (a 3.8 GB training run reported 7.2 GB under benchmark_training.py)."""
    own = 'import mxnet; from rn50.reports import logs; print(logs.peak_memory_mb())'   # as train.py's workers
    parent = ('import subprocess, sys\n'
              'held = b"x" * (800 << 20)\n'      # 800 MB, written, so resident
              f'print(subprocess.run([sys.executable, "-c", {own!r}], capture_output=True, text=True).stdout)')
    result = subprocess.run([sys.executable, '-c', parent], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 20 < float(result.stdout) < 600      # MXNet imported: a few hundred MB, not the parent's 800


@pytest.mark.integration
def test_lines_never_land_on_the_progress_bar(digits, tmp_path):
    """On a terminal (a pseudo-terminal here) the DLL and log lines start on lines of their own, not after
    the text of the bar, which tqdm draws without a newline."""
    import pty
    import subprocess
    import sys

    from conftest import ROOT, digits_flags
    main, child = pty.openpty()
    process = subprocess.Popen([sys.executable, 'train.py', *digits_flags(digits), '--num-layers', '10',
                                '--num-epochs', '1', '--num-examples', '128', '--disp-batches', '2',
                                '--data-backend', 'synthetic', '--mode', 'train', '--workspace', str(tmp_path)],
                               cwd=ROOT, stdin=child, stdout=child, stderr=child)
    os.close(child)
    output = b''
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:          # the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    assert process.wait() == 0, output[-2000:]
    text = output.decode(errors='replace')
    assert 'batch/s' in text or 'it/s' in text or '/8 [' in text          # a bar was drawn
    starts = [text[i - 1] for i in range(1, len(text)) if text.startswith('DLL ', i)]
    assert starts and set(starts) <= {'\n', '\r'}, set(starts)
