"""This CPU as oneDNN and OpenMP see it, settled before MXNet loads (they read their settings once).

Every program that runs MXNet on the CPU calls, before its first `import mxnet`:

    from rn50.world import cpu
    cpu.prepare_process()          # oneDNN's instruction set (AMX where the CPU has it), OpenMP threads
    cpu.load_mxnet()               # MXNet, without what the recipe does not need, operators compiled once

and logs `cpu.describe()` once. Three things happen in prepare_process, each only where nobody decided otherwise:

* AMX. MXNet 1.9.1 ships oneDNN 2.4.4, whose AMX kernels (bfloat16 and INT8) are built in but off unless
  DNNL_MAX_CPU_ISA=AVX512_CORE_AMX. Linux (5.16 on) also hands a process the AMX tile registers only after
  it asks (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), which oneDNN 2.4 does not do: with the
  variable alone the first AMX instruction kills the process (SIGILL, exit status 132). So on a CPU with
  AMX the permission is asked for first and the variable set only once it is granted. A user's own
  DNNL_MAX_CPU_ISA wins (DNNL_MAX_CPU_ISA=AVX512_CORE_BF16 turns AMX off); a user's AMX setting whose
  permission the kernel refuses falls back to AVX512_CORE_BF16 with a warning instead of dying.
* OpenMP threads. MXNet starts fewer OpenMP threads than cores (one on a 2-core machine) unless
  OMP_NUM_THREADS says otherwise: unset, it becomes this process's cores divided by the workers on the node
  (HOROVOD_LOCAL_SIZE, or the MPI / SLURM equivalent), as the runner sets it for its CPU workers.
* Nothing else: the choice of instruction set within the cap is oneDNN's, mirrored by `effective_isa` so the
  log and the benchmarks can name it (tests check the mirror against oneDNN's own DNNL_VERBOSE output).
"""
import ctypes
import logging
import os
import platform
import sys

log = logging.getLogger(__name__)

ISA_VARIABLE = 'DNNL_MAX_CPU_ISA'
AMX = 'AVX512_CORE_AMX'
NO_AMX = 'AVX512_CORE_BF16'

# oneDNN 2.4's dispatch order (cpu_isa_traits.cpp, get_isa_info_t): the first ISA this CPU has and the cap
# allows. Each: its DNNL_MAX_CPU_ISA value (None: cannot be named as a cap), the /proc/cpuinfo flags it needs,
# and the name DNNL_VERBOSE prints. AMX counts only under the AVX512_CORE_AMX cap (off by default in 2.4).
ISAS = [
    ('avx512_core_amx', 'AVX512_CORE_AMX',
     {'avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512_vnni', 'avx512_bf16', 'amx_tile', 'amx_int8',
      'amx_bf16'},
     'Intel AVX-512 with Intel DL Boost and bfloat16 support and Intel AMX with bfloat16 and 8-bit integer '
     'support'),
    ('avx512_core_bf16', 'AVX512_CORE_BF16',
     {'avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512_vnni', 'avx512_bf16'},
     'Intel AVX-512 with Intel DL Boost and bfloat16 support'),
    ('avx512_core_vnni', 'AVX512_CORE_VNNI', {'avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512_vnni'},
     'Intel AVX-512 with Intel DL Boost'),
    ('avx512_core', 'AVX512_CORE', {'avx512f', 'avx512bw', 'avx512vl', 'avx512dq'},
     'Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions'),
    ('avx2', 'AVX2', {'avx2', 'avx', 'sse4_1'}, 'Intel AVX2'),
    ('avx', 'AVX', {'avx', 'sse4_1'}, 'Intel AVX'),
    ('sse41', 'SSE41', {'sse4_1'}, 'Intel SSE4.1'),
]
ISA_NAMES = {key: name for key, _, _, name in ISAS}

# x86_64 Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) (asm/prctl.h, asm/fpu/types.h).
SYS_ARCH_PRCTL = 158
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

# What prepare_process decided, for describe().
_decision = {'amx': 'not looked at (cpu.prepare_process was not called)'}


def cpuinfo_field(name):
    """The value of `name` (e.g. 'model name', 'flags') for the first processor in /proc/cpuinfo, or ''."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                key, _, value = line.partition(':')
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ''


def cpu_flags():
    return set(cpuinfo_field('flags').split())


# The flags named with every measurement: what oneDNN's kernels, bfloat16 and INT8 run on.
SPEED_FLAGS = ('avx2', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'amx_bf16', 'amx_int8')


def identity(flags=None):
    """The CPU as every measurement names it: its model name, family and model (an AMD EPYC's model name says
    nothing of its generation: family 25 model 1 is a Zen 3, model 17 a Zen 4, family 26 a Zen 5) and which of
    SPEED_FLAGS it has, e.g. 'AMD EPYC (cpu family 25, model 1; avx2; no AVX-512, no AMX)'."""
    flags = cpu_flags() if flags is None else flags
    words = [flag for flag in SPEED_FLAGS if flag in flags]
    words += [] if 'avx512f' in flags else ['no AVX-512']
    words += [] if has_amx(flags) else ['no AMX']
    return (f'{cpuinfo_field("model name") or "unknown CPU"} (cpu family {cpuinfo_field("cpu family") or "?"}, model '
            f'{cpuinfo_field("model") or "?"}; {", ".join(words)})')


def has_amx(flags):
    return {'amx_tile', 'amx_bf16', 'amx_int8'} <= flags


def effective_isa(flags, cap=None):
    """The ISA oneDNN 2.4 dispatches to on a CPU with these /proc/cpuinfo flags under DNNL_MAX_CPU_ISA=cap
    (None or 'ALL': no cap; AMX is then still off). Returns a key of ISA_NAMES, or None (no SIMD it knows)."""
    caps = [value for _, value, _, _ in ISAS]
    allowed = caps[caps.index(cap):] if cap in caps else caps[1:]
    for key, value, needs, _ in ISAS:
        if value in allowed and needs <= flags:
            return key
    return None


def request_amx_permission():
    """Ask Linux for the AMX tile registers for this process (and the threads it starts afterwards). False
    where the kernel or CPU refuses (no AMX, a kernel before 5.16, not x86_64 Linux)."""
    if platform.system() != 'Linux' or platform.machine() != 'x86_64':
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0


def local_workers(environ):
    """How many workers share this node: the launcher's word for it, else 1."""
    for name in ('HOROVOD_LOCAL_SIZE', 'OMPI_COMM_WORLD_LOCAL_SIZE', 'MPI_LOCALNRANKS', 'SLURM_NTASKS_PER_NODE'):
        value = environ.get(name, '')
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def available_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


def prepare_process(environ=os.environ, flags=None, ask_permission=request_amx_permission, cores=None):
    """Settle oneDNN's ISA cap and OpenMP's thread count in `environ` before MXNet loads (see the module
    docstring). Returns the decision about AMX, as one sentence."""
    flags = cpu_flags() if flags is None else flags
    user_cap = environ.get(ISA_VARIABLE)
    if user_cap and user_cap != AMX:
        decision = f'{ISA_VARIABLE}={user_cap} as set'
    elif not has_amx(flags):
        decision = 'this CPU has no AMX'
    elif ask_permission():
        environ[ISA_VARIABLE] = AMX
        decision = 'AMX on (the kernel granted the tile registers)' + (' as set' if user_cap else '')
    else:
        environ[ISA_VARIABLE] = NO_AMX
        decision = (f'AMX off: the kernel refused the tile registers (Linux 5.16 or later needed), so '
                    f'{ISA_VARIABLE}={NO_AMX}')
        if user_cap:
            log.warning('%s=%s asked for AMX, but the kernel refused this process the AMX tile registers: '
                        'running with %s instead (AMX needs Linux 5.16 or later)', ISA_VARIABLE, user_cap, NO_AMX)
    if not environ.get('OMP_NUM_THREADS'):
        cores = available_cores() if cores is None else cores
        environ['OMP_NUM_THREADS'] = str(max(1, cores // local_workers(environ)))
    _decision['amx'] = decision
    return decision


# What MXNet's import loads and the recipe does not need at that moment: refused while MXNet imports (None in
# sys.modules: the ModuleNotFoundError MXNet catches), importable as usual after it.
#   sklearn:     mxnet/model.py takes scikit-learn's BaseEstimator as the base class of FeedForward, MXNet's old model
#                API, which the recipe never uses; the demo's dataset script, its one user here, runs in a process
#                of its own.
#   scipy.stats: mxnet/contrib/quantization.py binds it for --calib-mode entropy alone (int8.calibrate hands it over
#                when that mode runs), mxnet/test_utils.py for statistical test helpers the recipe never calls.
#   scipy.sparse: mxnet/ndarray/sparse.py and utils.py bind it to convert SciPy's sparse matrices, which the recipe
#                never makes (without it, MXNet's own sparse arrays work as before).
# onnx (0.06 s) stays: imported after horovod.mxnet (in every Horovod worker), its import crashes the process (a
# segmentation fault in onnx.checker), so it loads with MXNet, before Horovod.
DEFERRED_BY_MXNET = ('sklearn', 'scipy.stats', 'scipy.sparse')


def load_mxnet():
    """Import MXNet (after prepare_process) without the modules of DEFERRED_BY_MXNET, and with its operators
    compiled by an earlier process (operator_cache.py); returns the mxnet module. In every process that loads it,
    on a Zen 4 (docs/cpu.md): 1.38 s of CPU as `import mxnet`, 1.02 to 1.08 s without the deferred modules, and
    about 0.65 s with the compiled operators too. The modules are refused for MXNet's import alone: one already
    loaded stays, and each imports as usual after it."""
    from rn50.world import operator_cache
    refused = [name for name in DEFERRED_BY_MXNET if name not in sys.modules]
    sys.modules.update(dict.fromkeys(refused))
    try:
        with operator_cache.compiled_once():
            import mxnet
    finally:
        for name in refused:
            if sys.modules.get(name, False) is None:   # still refused: importable again
                del sys.modules[name]
    return mxnet


def describe(environ=os.environ, flags=None):
    """One line for the log: the ISA oneDNN runs, why AMX is on or off, the OpenMP threads."""
    flags = cpu_flags() if flags is None else flags
    isa = effective_isa(flags, environ.get(ISA_VARIABLE))
    return (f'oneDNN runs {isa or "no SIMD it knows"} ({_decision["amx"]}); '
            f'OMP_NUM_THREADS={environ.get("OMP_NUM_THREADS", "unset")}')


def bfloat16_speed_warning(flags, environ=os.environ, inference=False):
    """Why --amp (bfloat16) on this CPU may be slower than float32, or None where it runs on AMX, or for
    `inference` (val, pred: the converted, fused bfloat16 network) on a CPU with avx512_bf16, where it ran
    twice as fast as float32 (docs/cpu.md). Raises nothing: whether bfloat16 runs at all is
    precision.check_cpu_bfloat16's question."""
    isa = effective_isa(flags, environ.get(ISA_VARIABLE))
    if isa == 'avx512_core_amx' or inference and 'avx512_bf16' in flags:
        return None
    if has_amx(flags):
        why = f'AMX is off ({_decision["amx"]})'
    elif 'avx512_bf16' in flags:
        why = 'this CPU has no AMX'
    else:
        why = 'this CPU has neither AMX nor avx512_bf16, so oneDNN emulates bfloat16'
    if inference:
        return f'--amp: {why}; emulated bfloat16 inference is slower than float32: leave out --amp for speed'
    return (f'--amp: {why}; without AMX bfloat16 training depends on the image size: ResNet-50 at 224 trained '
            '1.5-1.7x faster than float32 on an AMD EPYC Zen 4 (0.8x on an AVX-512 bfloat16 Xeon), but at 32x32 (the '
            'demo) 0.72x on a Zen 5 (111 against 154 images/s): compare with scripts/benchmark_training.py --amp '
            '--image-size S')
