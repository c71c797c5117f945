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


def mxnet_generated_sources(op_name='Convolution'):
    """The sources MXNet's import writes for `op_name`'s functions in this process (mx.nd's and mx.sym's), with the
    address of the operator's handle they call it by."""
    import ctypes
    from mxnet import base
    from mxnet.ndarray import register as ndarray_register
    from mxnet.symbol import register as symbol_register
    handle = base.OpHandle()
    base.check_call(base._LIB.NNGetOpHandle(base.c_str(op_name), ctypes.byref(handle)))
    return handle.value, [ndarray_register._generate_ndarray_function_code(handle, op_name, op_name)[0],
                          symbol_register._generate_symbol_function_code(handle, op_name, op_name)[0]]


@pytest.mark.unit
def test_an_operator_compiled_in_another_process_is_the_code_mxnet_writes_in_this_one():
    """The cache's code for a source with this process's handle equals compile(source), though it was compiled
    from another process's source (another address), and compiles nothing."""
    from rn50.world import operator_cache
    handle, sources = mxnet_generated_sources()
    for source in sources:
        assert source.count(str(handle)) == 1 and str(operator_cache.stand_in(len(str(handle)))) not in source
        elsewhere = source.replace(str(handle), str(handle + 40960))   # the same operator in another process
        first = operator_cache.Compiler({})
        assert first.code(elsewhere) == compile(elsewhere, '<string>', 'exec') and first.compiled == 1
        later = operator_cache.Compiler(first.used)
        assert later.code(source) == compile(source, '<string>', 'exec') and later.compiled == 0
        assert later.code(source) != first.code(elsewhere)     # the handle is a constant of the code
    stand_in = operator_cache.stand_in(len(str(handle)))
    for uncached in ('def f():\n    return 1\n', sources[0].replace('num_filter=_Null', f'num_filter={stand_in}')):
        compiler = operator_cache.Compiler({})
        assert compiler.code(uncached) == compile(uncached, '<string>', 'exec') and compiler.used == {}


@pytest.mark.unit
def test_an_unreadable_cache_is_compiled_over_and_an_unwritable_one_left_out(tmp_path):
    import marshal
    from rn50.world import operator_cache
    codes = {b'k' * 16: compile('x = 1', '<string>', 'exec')}
    damaged = tmp_path / 'damaged.marshal'
    for content in (b'', b'\x00garbage', marshal.dumps(codes)[:-9], marshal.dumps([1, 2]),
                    marshal.dumps({b'k' * 16: 1})):
        damaged.write_bytes(content)
        assert operator_cache.read(str(damaged)) == {}
    assert operator_cache.read(str(tmp_path / 'missing.marshal')) == {}
    assert operator_cache.write(str(tmp_path / 'a' / 'cache.marshal'), codes)
    assert operator_cache.read(str(tmp_path / 'a' / 'cache.marshal')) == codes
    (tmp_path / 'file').write_text('')
    assert not operator_cache.write(str(tmp_path / 'file' / 'cache.marshal'), codes)   # its folder is a file
    assert set(os.listdir(tmp_path)) == {'damaged.marshal', 'a', 'file'}
    assert os.listdir(tmp_path / 'a') == ['cache.marshal']     # no temporary file left


@pytest.mark.unit
def test_the_cache_is_in_the_users_cache_folder_or_nowhere(monkeypatch):
    from rn50.world import operator_cache
    monkeypatch.setenv('HOME', '/home/someone')
    name = operator_cache.CACHE_NAME
    assert operator_cache.cache_path({'XDG_CACHE_HOME': '/cache'}) == f'/cache/rn50/{name}'
    for xdg in ({}, {'XDG_CACHE_HOME': ''}, {'XDG_CACHE_HOME': 'relative'}):     # relative: ignored (XDG)
        assert operator_cache.cache_path(xdg) == f'/home/someone/.cache/rn50/{name}'
    monkeypatch.setattr(os.path, 'expanduser', lambda path: path)      # no HOME, no passwd entry: '~' stays
    assert operator_cache.cache_path({}) is None
    with operator_cache.compiled_once() as compiler:    # MXNet is loaded here: nothing to read, nothing written
        assert compiler.known == {}


LOADS_MXNET = '''
import json, sys
from rn50.world import cpu, operator_cache
cpu.prepare_process()
compilers, differ = set(), []
code = operator_cache.Compiler.code
def checked(compiler, source):
    compilers.add(compiler)
    made = code(compiler, source)
    differ.extend([] if made == compile(source, '<string>', 'exec') else [source[:200]])
    return made
operator_cache.Compiler.code = checked
mx = cpu.load_mxnet()
print(json.dumps({
    'compiled': sum(c.compiled for c in compilers), 'used': sum(len(c.used) for c in compilers), 'differ': differ,
    'relu': mx.nd.Activation(mx.nd.array([-1, 2]), act_type='relu').asnumpy().tolist(),
    'symbol': mx.sym.FullyConnected(mx.sym.var('x'), num_hidden=3, name='fc').list_arguments(),
    'left': [name for name in operator_cache.GENERATORS if 'exec' in vars(sys.modules[name])
             or isinstance(sys.modules[name].__loader__, operator_cache.GeneratorLoader)]}))
'''


@pytest.mark.integration
def test_mxnet_loads_the_operators_an_earlier_process_compiled(tmp_path):
    """cpu.load_mxnet's first process compiles MXNet's operators and keeps them; the next compiles none, and
    every function it makes is the code MXNet wrote in that process (handles included), and works."""
    from rn50.world import operator_cache
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))

    def load():
        result = subprocess.run([sys.executable, '-c', LOADS_MXNET], cwd=ROOT, env=env, capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        return __import__('json').loads(result.stdout.splitlines()[-1])
    first = load()
    assert first['compiled'] > 2000 and first['differ'] == [] and first['left'] == []
    cache = tmp_path / 'rn50' / operator_cache.CACHE_NAME
    assert len(operator_cache.read(str(cache))) == first['used']
    written = cache.stat().st_mtime_ns
    later = load()
    assert later['compiled'] == 0 and later['used'] == first['used'] and later['differ'] == []
    assert later['relu'] == [0.0, 2.0] and later['symbol'] == ['x', 'fc_weight', 'fc_bias'] and later['left'] == []
    assert cache.stat().st_mtime_ns == written     # nothing to write again
