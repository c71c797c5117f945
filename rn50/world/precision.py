"""The precision a worker computes in with --amp: float16 on GPUs, bfloat16 on the CPU (which needs AVX-512),
with mxnet.contrib.amp initialised for it before the network is built. devices.resolve_devices calls

    amp_dtype = precision.start_amp(args.amp, on_gpu, inference)   # 'float16', 'bfloat16' or None

and a bfloat16 this CPU cannot run is a RecipeError; one that may run slower than float32 is a warning.
"""
import logging

from rn50.errors import RecipeError
from rn50.world import cpu

log = logging.getLogger(__name__)


def start_amp(amp, on_gpu, inference=False):
    """--amp's dtype (`amp`: the flag; float16 on GPU, bfloat16 on CPU; the network stays float32, resolve.py made
    --dtype float32), with mxnet.contrib.amp initialised for it; None without --amp. Inference on the CPU
    (`inference`: val, pred) does not initialise AMP: it converts the trained network to bfloat16 as a whole and
    fuses it then (evaluation.fused_bfloat16), as AMP's casts between the operators would keep oneDNN from fusing
    them."""
    if not amp:
        return None
    amp_dtype = 'float16' if on_gpu else 'bfloat16'
    if amp_dtype == 'bfloat16':
        check_cpu_bfloat16(inference=inference)
    if on_gpu or not inference:
        from mxnet.contrib import amp
        amp.init(target_dtype=amp_dtype)
    return amp_dtype


def check_cpu_bfloat16(inference=False):
    """oneDNN runs bfloat16 fast on AMX, natively with avx512_bf16 alone (training at a speed that depends on
    the CPU, inference of the fused bfloat16 network fast), emulated on other AVX-512 CPUs, and not at all on
    AVX2-only CPUs (it fails deep inside with 'could not create a primitive descriptor'). What may be slower
    than float32 is said once, with the reason."""
    flags = cpu.cpu_flags()
    if 'avx512f' not in flags:
        raise RecipeError('--amp on the CPU means bfloat16, which needs an AVX-512 CPU (fast with AMX) and this '
                          'CPU has none: train in float32 (leave out --amp)')
    warning = cpu.bfloat16_speed_warning(flags, inference=inference)
    if warning:
        log.warning(warning)
