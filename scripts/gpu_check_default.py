"""scripts/gpu_check.py's check of the default command, and what it says of the GPUs first.

    python scripts/gpu_check.py --only default               # ./runner -n <every GPU> -b B, shortened
    python scripts/gpu_check.py --device cpu --only default  # its CPU twin: ResNet-10 at 32x32, 2 Gloo workers

`default` is `./runner -n 8 -b 192` shortened: ResNet-50 at 224 on ImageNet-sized JPEGs (made here: noise photos
of 400x300, about 90 KB each, as ImageNet's average) through dali-gpu, with the runner's float16, NHWC layouts,
4-channel input and NVIDIA's fused kernels, two short epochs on every GPU of the node (the state written after
each), then `--mode val` and `--mode pred` on the GPUs, and `--amp` as the runner gives it. Its images/s are
measured apart, as the original measured its published figures (PUBLISHED): the repository's benchmark.py with
the original's `--mode train -i 500 -e 3 -w 1 --num-examples 32000` (MEASUREMENT: no validation, no state
written, so no background write under a measured epoch; the first epoch left out). It reports those images/s
and their ratio to the figure for this GPU and GPU count at its batch, where there is one, the same measurement
with the float16 step's other order (`--overflow-check before-update`: the host reads the overflow flag before
it queues the update, instead of undoing an overflowed update from device copies), the time between the epochs
besides validation (train.epoch_gap) of the two-epoch run, and the training loader's speed alone on the node's
storage with the page cache dropped (reader_speeds).

`device_line` names each GPU's compute capability against the ones this MXNet was built for, and gpu_check stops
at once where a GPU cannot run it. The PyPI wheel mxnet-cu112 1.9.1 holds machine code for 5.0, 6.0, 7.0, 8.0 and
8.6 and no PTX (cuobjdump of its libmxnet.so: 198 cubins each, `--list-ptx` finds none), so GPUs of 5.0 to 8.9
run it (machine code runs on its architecture's later minor versions) and an H100 (9.0) cannot: there is no PTX
for its driver to compile (docs/gpu-paths.md says what to use instead). nvidia-smi tells the capability from
driver R510; on older drivers (the 22.xx containers run on R470 through CUDA's compatibility package) the CUDA
driver API does, so the GPU's model, and with it the ratio to the published figure, is never lost to the driver's
age.
"""
import json
import os
import re
import shutil
import sys

import bootstrap
from gpu_check_training import epoch_metrics, last_error, replicas_agree, run, runner, trained

# The original recipe's published training throughput, mixed precision (its README, 22.10 and 20.12 containers;
# benchmark.py --mode train -i 500 -e 3 -w 1): images/s of all GPUs by GPU count, at its batch per GPU.
PUBLISHED = {'A100 80GB': {'batch': 512, 1: 3410.52, 4: 13442.66, 8: 26673.72},
             'V100 16GB': {'batch': 192, 1: 1376, 2: 2768, 4: 5357, 8: 10723},
             'V100 32GB': {'batch': 256, 1: 1492, 2: 2935, 4: 5726, 8: 11368, 16: 21484}}
DEFAULT_BATCH = 192
# How the original measured PUBLISHED: benchmark.py with these flags (a fresh launch, --no-metrics, the data
# wrapped to 500 iterations an epoch, the harmonic mean of the epochs after the first); the CPU twin the same,
# shorter. Each gives one value of train.ips, as benchmark.py reports it.
MEASUREMENT = {'gpu': ['-i', '500', '-e', '3', '-w', '1', '--num-examples', '32000'],
               'cpu': ['-i', '3', '-e', '2', '-w', '1', '--num-examples', '48']}
STEPS = {'gpu': 20, 'cpu': 3}    # per epoch and worker of the two-epoch run that val and pred then use
PHOTOS = {'gpu': (2048, (400, 300)), 'cpu': (64, (48, 36))}     # how many, of what size
TWIN = ['--num-layers', '10', '--image-shape', '3,32,32', '--num-classes', '10', '--data-val-resize', '36',
        '--dali-threads', '1', '--dali-validation-threads', '1']


# ----------------------------------------------------------------------------------------------------------
# The GPUs


def gpu_facts(nvidia_smi_output):
    """[(name, compute capability, memory in MiB)] of `nvidia-smi --query-gpu=name,compute_cap,memory.total
    --format=csv,noheader,nounits` (with pci.bus_id for compute_cap: the bus id in its place)."""
    facts = []
    for line in nvidia_smi_output.strip().splitlines():
        parts = [part.strip() for part in line.split(',')]
        if len(parts) == 3:
            facts.append((parts[0], parts[1], int(float(parts[2])) if parts[2].replace('.', '').isdigit() else 0))
    return facts


def built_capabilities(cuobjdump_elf, cuobjdump_ptx):
    """(the compute capabilities this MXNet has kernels for, those it has PTX for), as '8.6', from `cuobjdump
    --list-elf` and `--list-ptx` of libmxnet.so (lines such as "ELF file    1: libmxnet.1.sm_86.cubin" and
    "PTX file    1: libmxnet.1.sm_86.ptx")."""
    def capabilities(text, suffix):
        found = re.findall(rf'\.sm_(\d+)[a-z]?\.{suffix}\b', text)
        return sorted({f'{m[:-1]}.{m[-1]}' for m in found}, key=float)
    return capabilities(cuobjdump_elf, 'cubin'), capabilities(cuobjdump_ptx, 'ptx')


def capability_words(capability, kernels, ptx):
    """(how a GPU of `capability` ('?': not known) runs this MXNet, given built_capabilities' lists; whether it
    can). Machine code for X.y runs on X.z for z >= y (CUDA's binary compatibility: a T4, 7.5, runs 7.0's); PTX
    of X.y is compiled by the driver for any later GPU, at the first start (minutes; cached in ~/.nv/ComputeCache,
    kept between runs only where that folder is)."""
    if not kernels:
        return 'this MXNet\'s kernels could not be listed (cuobjdump not found)', True
    compiled = 'PTX for ' + ', '.join(ptx) if ptx else 'no PTX'
    built = f'this MXNet has machine code for {", ".join(kernels)} and {compiled}'
    if capability == '?':
        return f'{built}: whether this GPU runs it is not known', True
    own = version(capability)
    if capability in kernels:
        return f'{built}: native', True
    same_architecture = [k for k in kernels if version(k)[0] == own[0] and version(k) < own]
    if same_architecture:
        return f'{built}: runs the machine code of {same_architecture[-1]} (same architecture)', True
    earlier_ptx = [p for p in ptx if version(p) <= own]
    if earlier_ptx:
        return f'{built}: runs through the driver\'s compilation of the PTX of {earlier_ptx[-1]} (minutes at the ' \
               'first start, cached in ~/.nv/ComputeCache; kernels not tuned for this GPU)', True
    return f'{built}: this GPU cannot run it (CUDA\'s "no kernel image is available"); use an MXNet built for ' \
           f'{capability} (docs/gpu-paths.md#mxnet-and-gpus)', False


def version(capability):
    """'8.6' -> (8, 6): compute capabilities compared as numbers ('10.0' after '9.0')."""
    return tuple(int(part) for part in capability.split('.'))


def query_gpus():
    """(gpu_facts of every GPU, '') or ([], nvidia-smi's error). nvidia-smi has the compute_cap field from driver
    R510; an older driver refuses it (`Field "compute_cap" is not a valid field to query.`), and the capability
    comes from the CUDA driver API instead (cuda_driver.capability)."""
    status, smi = run(['nvidia-smi', '--query-gpu=name,compute_cap,memory.total', '--format=csv,noheader,nounits'])
    if status == 0:
        return gpu_facts(smi), ''
    status, smi = run(['nvidia-smi', '--query-gpu=name,pci.bus_id,memory.total', '--format=csv,noheader,nounits'])
    if status:
        return [], last_error(smi)
    bootstrap.on_path()
    from rn50.world import cuda_driver
    return [(name, cuda_driver.capability(bus_id), memory) for name, bus_id, memory in gpu_facts(smi)], ''


def device_line():
    """(one line per GPU: its name, memory and compute capability against this MXNet's build; whether every GPU
    can run this MXNet)."""
    facts, error = query_gpus()
    if error:
        return f'GPUs: nvidia-smi failed ({error})', True
    import mxnet as mx
    library = mx.libinfo.find_lib_path()[0]
    listings = []
    for flag in ('--list-elf', '--list-ptx'):
        status, text = run(['cuobjdump', flag, library]) if shutil.which('cuobjdump') else (1, '')
        listings.append(text if status == 0 else '')
    kernels, ptx = built_capabilities(*listings)
    said = [capability_words(capability, kernels, ptx) for _, capability, _ in facts]
    return '\n'.join(f'GPU {i}: {name}, {memory} MiB, compute capability {capability}; {words}'
                     for i, ((name, capability, memory), (words, _)) in enumerate(zip(facts, said))), \
        all(runs for _, runs in said)


def gpu_key(name, memory):
    """PUBLISHED's key for a GPU of this name and memory (MiB), or None."""
    model = next((model for model in ('A100', 'V100') if model in name), None)
    size = min((80, 40, 32, 16), key=lambda gb: abs(gb * 1024 - memory))
    key = f'{model} {size}GB'
    return key if key in PUBLISHED else None


def published(key, gpus, batch):
    """The original recipe's images/s for the GPU of `key` at `gpus` GPUs and `batch` per GPU, or None."""
    figures = PUBLISHED.get(key) or {}
    return figures.get(gpus) if figures.get('batch') == batch else None


# ----------------------------------------------------------------------------------------------------------
# The check


def photo_dataset(workdir, device):
    """ImageNet-sized JPEGs of noise in 10 class folders (written by a process of their own: this one has loaded
    MXNet, whose JPEG symbols Pillow would then use), converted by the recipe's own prepare_dataset.py (a tenth
    held out for validation); made once per workdir. Returns (the RecordIO folder, one image)."""
    count, (width, height) = PHOTOS[device]
    folder = os.path.join(workdir, 'photos')
    images, records = os.path.join(folder, 'images'), os.path.join(folder, 'rec')
    if not os.path.exists(os.path.join(records, 'val.idx')):
        for command in ([sys.executable, os.path.abspath(__file__), images, str(count), str(width), str(height)],
                        [sys.executable, os.path.join(bootstrap.ROOT, 'scripts', 'prepare_dataset.py'), images,
                         records, '--val-fraction', '0.1']):
            status, output = run(command)
            if status:
                raise RuntimeError(f'could not build the photo dataset: {last_error(output)}')
    return records, os.path.join(images, 'class_0', 'image_0.jpg')


def write_photos(folder, count, width, height):
    """`count` JPEGs of noise, width x height, image_<i // 10>.jpg in class_<i % 10>/ of `folder`."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8) // 4 * 4
        path = os.path.join(folder, f'class_{i % 10}', f'image_{i // 10}.jpg')
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(pixels).save(path, format='JPEG', quality=85)


def reader_speeds(common, data, workdir):
    """The training loader alone (--test-io) on this node's storage, images/s: the page cache dropped, with the
    .rec mapped (the default: the feed thread's page faults hold Python's lock, which the training thread needs)
    and with positioned reads (--dali-dont-use-mmap, which release it), then warm. Slow storage shows in the
    first two."""
    speeds = []
    for name, cold, flags in (('cold, mmap', True, []), ('cold, positioned reads', True, ['--dali-dont-use-mmap']),
                              ('warm', False, [])):
        if cold:
            bootstrap.on_path()
            from rn50.data import records
            records.drop_page_cache(os.path.join(data, 'train.rec'))
        workspace = os.path.join(workdir, 'reader-' + name.replace(', ', '-').replace(' ', '-'))
        status, output = run(runner(*common, '--test-io', '--workspace', workspace, *flags))
        summary = read_summary(workspace) if status == 0 else {}
        if 'train.ips' not in summary:
            raise RuntimeError(f'--test-io ({name}): {last_error(output)}')
        speeds.append(f'{name} {summary["train.ips"]:.0f}')
    return 'reader alone (--test-io): ' + ', '.join(speeds) + ' img/s'


def read_summary(workspace):
    bootstrap.on_path()
    from rn50.reports import logs
    return logs.read_dllogger(os.path.join(workspace, 'dllogger_log.log'))[-1]['data']


def gpu_model():
    """(name, memory in MiB) of GPU 0, or ('', 0)."""
    facts = query_gpus()[0]
    return (facts[0][0], facts[0][2]) if facts else ('', 0)


def measurement(workers, batch, device, data, output, *extra):
    """benchmark.py's command for the original's measurement (MEASUREMENT) of `workers` x `batch` on the photo
    set `data` (the twin: ResNet-10 at 32x32), its report at `output`; `extra`: more train.py flags."""
    return [sys.executable, os.path.join(bootstrap.ROOT, 'benchmark.py'), '-n', str(workers), '-b', str(batch),
            '-o', output, '--mode', 'train', *MEASUREMENT[device], '--data-root', data] + \
        ([] if device == 'gpu' else TWIN) + list(extra)


def measured_ips(workers, batch, device, data, workdir, *extra):
    """train.ips of `workers` x `batch` as the original measured it (measurement, with the train.py flags
    `extra`); a RuntimeError with the point's error where it failed."""
    output = os.path.join(workdir, '-'.join(['measurement'] + [flag.lstrip('-') for flag in extra]) + '.json')
    status, text = run(measurement(workers, batch, device, data, output, *extra), timeout=3600)
    point = {}
    if os.path.exists(output):
        with open(output) as f:
            point = json.load(f)['metrics'].get(str(workers), {}).get(str(batch)) or {}
    if point.get('train.ips') is None:
        raise RuntimeError(f'benchmark.py: {last_error(text)}')
    return point['train.ips']


def check_default(options, workdir):
    """The default command shortened (the module docstring): passed when it trains, its workers agree after each
    epoch, val and pred run on its weights and --amp trains; the figures in the detail. On GPUs at the batch of
    the original's figure for this GPU (192 where it has none); the CPU twin trains and measures ResNet-10 at 32x32
    on 2 Gloo workers of 8 images, 3 steps an epoch, and runs val, pred, the reader and --amp in one."""
    on_gpu = options.device == 'gpu'
    workers = options.gpus if on_gpu else 2
    name, memory = gpu_model() if on_gpu else ('', 0)
    key = gpu_key(name, memory)
    batch = (PUBLISHED[key]['batch'] if key else DEFAULT_BATCH) if on_gpu else 8
    data, image = photo_dataset(workdir, options.device)
    common = ['-n', str(workers), '-b', str(batch), '--data-root', data] + ([] if on_gpu else TWIN)
    # the runs after the first (val, pred, the reader, --amp) on every GPU; the twin's in one process (its first run
    # and the measurement have the 2 workers: the replica check, and benchmark.py's launch of several)
    follow_up = common if on_gpu else ['-n', '1', '-b', str(batch), '--data-root', data] + TWIN
    size = ['--num-examples', str(workers * batch * STEPS[options.device]), '--seed', '1']
    workspace = os.path.join(workdir, 'default')
    status, output = run(runner(*common, '-e', '2', *size, '--workspace', workspace), timeout=3600)
    passed, detail = trained(workspace, status, output)
    if not passed:
        return False, f'training: {detail}'
    agreed, agreement = replicas_agree(output, workers, [0, 1])
    if not agreed:
        return False, agreement
    plan = 'float32, the CPU twin' if not on_gpu else 'float16, NHWC, 4-channel input, ' + (
        'fused kernels' if '--fuse-bn-relu 1' in output else 'no fused kernels in this MXNet')
    metrics = epoch_metrics(workspace)
    ips, figure = measured_ips(workers, batch, options.device, data, workdir), published(key, workers, batch)
    flags = ' '.join(MEASUREMENT[options.device][:6])
    words = [f'{workers} x {batch} ({plan}): {ips:.1f} img/s (benchmark.py --mode train {flags})' +
             (f', {ips / figure:.2f} of the original\'s {figure:g} on {key}' if figure else ''),
             f'{metrics[0]["train.epoch_gap"]:.2f} s between epochs']
    if on_gpu:   # the float16 step's other order, measured alike: docs/gpu-paths.md keeps the faster the default
        other = measured_ips(workers, batch, options.device, data, workdir, '--overflow-check', 'before-update')
        words.append(f'--overflow-check before-update {other:.1f} img/s, {other / ips:.3f} of after-update\'s '
                     '(the default)')
    status, output = run(runner('--mode', 'val', *follow_up, '--workspace', workspace))
    validated = epoch_metrics(workspace)[-1] if status == 0 else {}
    if 'val.ips' not in validated:
        return False, f'val: {last_error(output)}'
    words.append(f'val {validated["val.ips"]:.1f} img/s, top-1 {validated["val.accuracy"]:.3f}')
    status, output = run(runner('--mode', 'pred', '--data-root', data, '--workspace', workspace, '--data-pred', image))
    if status or 'class_' not in output:
        return False, f'pred: {last_error(output)}'
    words.append('pred ok')
    words.append(reader_speeds(follow_up, data, workdir))
    amp = os.path.join(workdir, 'default-amp')
    status, output = run(runner(*follow_up, '-e', '1', *size, '--amp', '--workspace', amp), timeout=3600)
    if not on_gpu and status == 2 and 'needs an AVX-512 CPU' in output:
        words.append('--amp skipped (bfloat16 needs AVX-512)')
    else:
        passed, detail = trained(amp, status, output)
        if not passed:
            return False, f'--amp: {detail}'
        words.append(f'--amp {epoch_metrics(amp)[-1]["train.ips"]:.1f} img/s')
    return True, '; '.join(words)


RUNS = {'default': check_default}


if __name__ == '__main__':   # photo_dataset's writer, in a process without MXNet
    import argparse
    parser = argparse.ArgumentParser(description='gpu_check.py default\'s photographs (it runs this file): COUNT '
                                     'noise JPEGs of WIDTH x HEIGHT in 10 class folders of FOLDER')
    parser.add_argument('folder')
    parser.add_argument('count', type=int)
    parser.add_argument('width', type=int)
    parser.add_argument('height', type=int)
    options = parser.parse_args()
    bootstrap.start()   # .venv in a fresh shell, for Pillow and numpy
    write_photos(options.folder, options.count, options.width, options.height)
