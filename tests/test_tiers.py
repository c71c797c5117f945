"""The suite's tiers (pytest.ini, conftest.py): every test has exactly one, and a unit test trains nothing (it once
read trained_digits, which put a 40-second training run into `make test-fast`)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.unit

PROBE = '''import pytest


@pytest.mark.unit
def test_reads_a_run(trained_digits):
    pass


@pytest.mark.integration
def test_trains_in_its_tier(trained_digits):
    pass


def test_without_a_tier():
    pass
'''


def test_a_test_without_a_tier_or_a_unit_test_that_reads_a_training_run_fails_to_collect():
    probe = os.path.join(ROOT, 'tests', f'_tier_probe_{os.getpid()}.py')   # not test_*: no other run collects it
    with open(probe, 'w') as f:
        f.write(PROBE)
    try:
        result = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-p', 'no:cacheprovider',
                                 probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                                env=dict(os.environ, PYTHONDONTWRITEBYTECODE='1'))   # no .pyc of it left
    finally:
        os.remove(probe)
    assert result.returncode != 0
    assert 'test_reads_a_run: unit, but reads trained_digits (a training run): integration' in result.stdout
    assert 'test_without_a_tier: no tier' in result.stdout
    assert 'test_trains_in_its_tier' not in result.stdout.split('these do not:')[1]
