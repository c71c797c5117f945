"""What the CUDA driver says of this machine's GPUs, without MXNet: libcuda.so.1, which every driver version has,
through ctypes (the driver API: docs.nvidia.com/cuda/cuda-driver-api).

    cuda_driver.gpu_count()                   # GPUs this process sees (CUDA_VISIBLE_DEVICES applies); 0 without
    cuda_driver.capability('00000000:3B:00.0')  # '7.0' of the GPU at that PCI bus id (nvidia-smi's), '?' unknown

The runner plans a launch from gpu_count() before anything loads MXNet (3 s), so that a one-worker run, which
becomes the worker in the runner's own process, loads it once, with the worker's environment already set.
"""
import ctypes

# cuDeviceGetAttribute's attributes (cuda.h): the major and minor numbers of the compute capability
CAPABILITY_MAJOR, CAPABILITY_MINOR = 75, 76


def library():
    """The CUDA driver API (libcuda.so.1), or None on a machine without NVIDIA's driver."""
    try:
        return ctypes.CDLL('libcuda.so.1')
    except OSError:
        return None


def gpu_count():
    """How many GPUs this process sees, as MXNet's mx.context.num_gpus() counts them on a CUDA build (both ask the
    driver, which applies CUDA_VISIBLE_DEVICES); 0 without a driver or where it fails to start (no GPU)."""
    cuda = library()
    count = ctypes.c_int()
    if cuda is None or cuda.cuInit(0) or cuda.cuDeviceGetCount(ctypes.byref(count)):
        return 0
    return count.value


def capability(bus_id):
    """The compute capability ('7.0') of the GPU at PCI address `bus_id` (nvidia-smi's pci.bus_id), or '?' where
    the driver cannot tell."""
    cuda = library()
    device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cuda is None or cuda.cuInit(0) or cuda.cuDeviceGetByPCIBusId(ctypes.byref(device), bus_id.encode()) or \
            cuda.cuDeviceGetAttribute(ctypes.byref(major), CAPABILITY_MAJOR, device) or \
            cuda.cuDeviceGetAttribute(ctypes.byref(minor), CAPABILITY_MINOR, device):
        return '?'
    return f'{major.value}.{minor.value}'
