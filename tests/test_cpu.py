"""cpu.py: oneDNN's instruction set, the AMX permission and OpenMP threads, settled before MXNet loads.

The choice logic is tested on every CPU with the flags of the three CPUs this project has met; the mirror of
oneDNN's dispatch is checked against oneDNN's own DNNL_VERBOSE output on whatever CPU runs the suite; what
needs AMX itself skips, saying so, where the CPU has none."""
import os
import subprocess
import sys

import pytest

from rn50.world import cpu
from conftest import ROOT, digits_flags

AVX512 = {'avx', 'avx2', 'sse4_1', 'avx512f', 'avx512bw', 'avx512vl', 'avx512dq'}
EPYC_AVX2 = {'avx', 'avx2', 'sse4_1', 'fma'}
XEON_VNNI = AVX512 | {'avx512_vnni'}
XEON_AMX = XEON_VNNI | {'avx512_bf16', 'amx_tile', 'amx_bf16', 'amx_int8'}
THIS_CPU = cpu.cpu_flags()
HAS_AMX = cpu.has_amx(THIS_CPU)


@pytest.mark.unit
def test_effective_isa_follows_onednn_dispatch_and_cap():
    assert cpu.effective_isa(EPYC_AVX2) == 'avx2'
    assert cpu.effective_isa(XEON_VNNI) == 'avx512_core_vnni'
    assert cpu.effective_isa(XEON_AMX) == 'avx512_core_bf16'             # AMX is off by default in oneDNN 2.4
    assert cpu.effective_isa(XEON_AMX, 'ALL') == 'avx512_core_bf16'
    assert cpu.effective_isa(XEON_AMX, 'AVX512_CORE_AMX') == 'avx512_core_amx'
    assert cpu.effective_isa(XEON_AMX, 'AVX2') == 'avx2'
    assert cpu.effective_isa(EPYC_AVX2, 'AVX512_CORE_AMX') == 'avx2'     # a cap never adds what the CPU lacks
    assert cpu.effective_isa(XEON_AMX, 'avx2') == 'avx512_core_bf16'     # oneDNN ignores a value it cannot read


def onednn_reported_isa(cap):
    """The 'isa:' line oneDNN prints in this process's environment with DNNL_MAX_CPU_ISA=cap (None: unset)."""
    env = dict(os.environ, DNNL_VERBOSE='1')
    env.pop('DNNL_MAX_CPU_ISA', None)
    if cap:
        env['DNNL_MAX_CPU_ISA'] = cap
    code = ('import mxnet as mx; x = mx.nd.ones((1, 3, 8, 8)); w = mx.nd.ones((4, 3, 3, 3)); '
            'mx.nd.Convolution(x, w, no_bias=True, kernel=(3, 3), num_filter=4).wait_to_read()')
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True).stdout
    return next(line.split('isa:', 1)[1] for line in out.splitlines() if ',isa:' in line)


@pytest.mark.parametrize('cap', [None, 'AVX2', 'SSE41'])
@pytest.mark.unit
def test_mirror_names_the_isa_onednn_runs_on_this_cpu(cap):
    assert onednn_reported_isa(cap) == cpu.ISA_NAMES[cpu.effective_isa(THIS_CPU, cap)]


@pytest.mark.unit
def test_amx_is_turned_on_only_with_the_kernels_permission():
    env = {}
    assert 'AMX on' in cpu.prepare_process(env, XEON_AMX, ask_permission=lambda: True, cores=2)
    assert env['DNNL_MAX_CPU_ISA'] == 'AVX512_CORE_AMX'
    env = {}
    assert 'refused' in cpu.prepare_process(env, XEON_AMX, ask_permission=lambda: False, cores=2)
    assert env['DNNL_MAX_CPU_ISA'] == 'AVX512_CORE_BF16'       # never AMX without the tile registers (SIGILL)
    env = {}
    asked = []
    cpu.prepare_process(env, XEON_VNNI, ask_permission=lambda: asked.append(1) or True, cores=2)
    assert 'DNNL_MAX_CPU_ISA' not in env and not asked


@pytest.mark.unit
def test_the_users_isa_setting_wins_unless_the_kernel_refuses_amx(caplog):
    env = {'DNNL_MAX_CPU_ISA': 'AVX512_CORE_BF16'}
    cpu.prepare_process(env, XEON_AMX, ask_permission=lambda: pytest.fail('asked for AMX turned off'), cores=2)
    assert env['DNNL_MAX_CPU_ISA'] == 'AVX512_CORE_BF16'
    env = {'DNNL_MAX_CPU_ISA': 'AVX512_CORE_AMX'}
    cpu.prepare_process(env, XEON_AMX, ask_permission=lambda: True, cores=2)
    assert env['DNNL_MAX_CPU_ISA'] == 'AVX512_CORE_AMX'
    env = {'DNNL_MAX_CPU_ISA': 'AVX512_CORE_AMX'}
    cpu.prepare_process(env, XEON_AMX, ask_permission=lambda: False, cores=2)
    assert env['DNNL_MAX_CPU_ISA'] == 'AVX512_CORE_BF16' and 'refused' in caplog.text


@pytest.mark.unit
def test_openmp_threads_are_the_cores_shared_by_the_local_workers():
    env = {}
    cpu.prepare_process(env, EPYC_AVX2, cores=8)
    assert env['OMP_NUM_THREADS'] == '8'
    env = {'HOROVOD_LOCAL_SIZE': '2'}
    cpu.prepare_process(env, EPYC_AVX2, cores=8)
    assert env['OMP_NUM_THREADS'] == '4'
    env = {'OMPI_COMM_WORLD_LOCAL_SIZE': '16'}
    cpu.prepare_process(env, EPYC_AVX2, cores=8)
    assert env['OMP_NUM_THREADS'] == '1'
    env = {'OMP_NUM_THREADS': '3', 'HOROVOD_LOCAL_SIZE': '2'}
    cpu.prepare_process(env, EPYC_AVX2, cores=8)
    assert env['OMP_NUM_THREADS'] == '3'


@pytest.mark.unit
def test_amp_says_why_bfloat16_is_slower_than_float32():
    assert cpu.bfloat16_speed_warning(XEON_AMX, {'DNNL_MAX_CPU_ISA': 'AVX512_CORE_AMX'}) is None
    assert 'AMX is off' in cpu.bfloat16_speed_warning(XEON_AMX, {})
    assert 'no AMX' in cpu.bfloat16_speed_warning(XEON_AMX - {'amx_tile', 'amx_bf16', 'amx_int8'}, {})
    # it says at which sizes bfloat16 trains slower (issue 50: the demo's 32x32 at 0.72x on a Zen 5)
    assert 'at 32x32 (the demo) 0.72x' in cpu.bfloat16_speed_warning(XEON_AMX - {'amx_tile', 'amx_bf16', 'amx_int8'}, {})
    assert 'emulates' in cpu.bfloat16_speed_warning(XEON_VNNI, {})
    # val and pred run the converted, fused bfloat16 network: fast wherever avx512_bf16 is, emulated elsewhere
    assert cpu.bfloat16_speed_warning(XEON_AMX - {'amx_tile', 'amx_bf16', 'amx_int8'}, {}, inference=True) is None
    assert 'emulated bfloat16 inference' in cpu.bfloat16_speed_warning(XEON_VNNI, {}, inference=True)


@pytest.mark.unit
def test_the_amx_permission_request_matches_this_cpu():
    """Granted on a CPU with AMX (Linux 5.16 on), refused elsewhere, never a crash."""
    assert cpu.request_amx_permission() == HAS_AMX


@pytest.mark.skipif(not HAS_AMX, reason='this CPU has no AMX (amx_tile, amx_bf16, amx_int8 not in /proc/cpuinfo)')
@pytest.mark.unit
def test_bfloat16_runs_amx_kernels_after_prepare_process():
    code = ('from rn50.world import cpu; cpu.prepare_process()\n'
            'import mxnet as mx, numpy as np\n'
            # MXNet's bfloat16 is this numpy dtype: the name "bfloat16" is numpy's TypeError
            'bf16 = np.dtype([("bfloat16", np.uint16)])\n'
            'x = mx.nd.ones((1, 16, 8, 8), dtype=bf16); w = mx.nd.ones((16, 16, 3, 3), dtype=bf16)\n'
            'mx.nd.Convolution(x, w, no_bias=True, kernel=(3, 3), num_filter=16).wait_to_read()\n')
    env = dict(os.environ, DNNL_VERBOSE='1')
    env.pop('DNNL_MAX_CPU_ISA', None)
    result = subprocess.run([sys.executable, '-c', code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'amx' in result.stdout


@pytest.mark.integration
def test_train_py_uses_every_core_and_names_the_isa(digits, tmp_path):
    """`python train.py` without OMP_NUM_THREADS: the cores of this process, said in the log with oneDNN's ISA."""
    env = {k: v for k, v in os.environ.items() if k not in ('OMP_NUM_THREADS', 'DNNL_MAX_CPU_ISA')}
    result = subprocess.run([sys.executable, 'train.py', *digits_flags(digits), '--mode', 'train',
                             '--num-epochs', '1', '--num-layers', '10', '--data-backend', 'synthetic',
                             '--num-examples', '32', '--workspace', str(tmp_path), '--kv-store', 'device'],
                            cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    log = (tmp_path / 'log.log').read_text()
    isa = cpu.effective_isa(THIS_CPU, 'AVX512_CORE_AMX' if HAS_AMX else None)
    assert f'oneDNN runs {isa}' in log
    assert f'OMP_NUM_THREADS={max(1, cpu.available_cores())}' in log


@pytest.mark.unit
def test_the_cpu_is_named_by_family_model_and_the_flags_that_decide_its_speed():
    """An AMD EPYC's model name says nothing of its generation (Zen 3, 4 and 5 are all "AMD EPYC"): every
    measurement names the family, the model and the instruction sets (report.json's hardware, the logs, the
    benchmarks)."""
    family, model = cpu.cpuinfo_field('cpu family'), cpu.cpuinfo_field('model')
    assert f'(cpu family {family}, model {model}; avx2, no AVX-512, no AMX)' in cpu.identity({'avx2', 'sse4_1'})
    assert cpu.identity({'avx2', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'amx_bf16', 'amx_int8', 'amx_tile'}) \
        .endswith('; avx2, avx512f, avx512_vnni, avx512_bf16, amx_bf16, amx_int8)')
    from rn50.reports import logs
    assert logs.hardware()['cpu'] == cpu.identity()
