"""scripts/demo_pieces.sh, shortened: the plain run and the distillation from it (3 epochs of 64 digits, validated
after the last), the flip validation of the plain run's weights, and the table of what each run reached."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration


def test_demo_pieces_runs_the_pieces_and_tabulates_them(digits, tmp_path):
    out = tmp_path / 'pieces'
    env = dict(os.environ, PIECES='plain distill', EPOCHS='3', NET_FLAGS='--num-layers 10 --num-examples 64 --eval-period 3 --eval-offset 2',
               PYTHON=sys.executable, PATH=os.path.dirname(sys.executable) + ':' + os.environ['PATH'])
    result = subprocess.run([os.path.join(ROOT, 'scripts', 'demo_pieces.sh'), str(digits), str(out)],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith('| ')][1:]   # the header aside
    assert [row.split(' | ')[0] for row in rows] == ['| plain', '| distill',
                                                     '| plain, last weights, --mode val --tta flip']
    assert all(float(row.split(' | ')[1]) > 0 for row in rows)
    assert 'Distilling from' in (out / 'distill' / 'log.log').read_text()
