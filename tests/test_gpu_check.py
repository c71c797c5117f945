"""scripts/gpu_check.py: without a GPU it says so; with --device cpu it runs the CPU twins and reports them."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = os.path.join(ROOT, 'scripts', 'gpu_check.py')


@pytest.mark.integration
def test_without_a_gpu_it_asks_for_the_cpu_twins():
    result = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == ('error: no GPU found: this script checks the GPU paths; run it with '
                                     '--device cpu for their CPU twins')


@pytest.mark.multiworker
def test_cpu_twins_pass_are_reported_and_leave_nothing_behind(tmp_path):
    """The default command's check and the float16 twin end to end, through the script's table, JSON report and
    clean-up. default: photographs made and converted, 2 Gloo workers train two epochs and agree after each and are
    measured by benchmark.py, then one worker runs val and pred on their weights, the reader alone cold and warm and
    --amp (skipped, saying why, without AVX-512). float16:
    the float16 step on 2 Gloo workers, an inf on one of them. Without --workdir, its temporary folder goes at the
    end. The other twins run code that tests of their own run: the 2-worker resume from a CPU-only state
    (tests/test_train.py, tests/test_checkpoint.py), DALI's augmentations (tests/test_augment.py, and the recipes
    on 2 workers in tests/test_runner.py), the step over two CPU contexts (tests/test_fit.py), the export of a
    checkpoint in the GPU layout (tests/test_inference.py)."""
    output, scratch = tmp_path / 'report.json', tmp_path / 'tmp'
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch), PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    result = subprocess.run([sys.executable, SCRIPT, '--device', 'cpu', '--only', 'default,float16', '-o',
                             str(output)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert [(r['check'], r['verdict']) for r in report['results']] == [('default', 'PASS'), ('float16', 'PASS')]
    default, float16 = (r['detail'] for r in report['results'])
    assert default.startswith('2 x 8 (float32, the CPU twin): ') and ' s between epochs' in default
    assert ' img/s (benchmark.py --mode train -i 3 -e 2 -w 1)' in default.split(';')[0]   # the original's way
    assert 'pred ok' in default and 'reader alone (--test-io): cold, mmap ' in default and ', warm ' in default
    assert '--amp' in default
    assert 'inf on rank 1' in float16 and 'weights equal' in float16
    assert result.stdout.splitlines()[0].startswith('versions: MXNet 1.9.1, DALI ')
    assert result.stdout.splitlines()[2].startswith('float16         PASS')
    assert report['versions']['NCCL'] == 'not built (Gloo only)'
    assert list(scratch.iterdir()) == []


@pytest.mark.unit
def test_the_default_check_measures_as_the_original_measured_its_published_figures():
    """Issue 57 item 3: the ratio to the original's figure came from the second epoch of a train_val run of 20 steps,
    the state of the first written in the background under it; the original's figures are benchmark.py's --mode
    train -i 500 -e 3 -w 1 --num-examples 32000. The check now runs the repository's benchmark.py with those flags
    (the twin with 3 iterations, 2 epochs): parsed here by benchmark.py itself, down to the runner's command."""
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    import gpu_check_default as default
    import benchmark
    command = default.measurement(8, 512, 'gpu', '/data/photos', '/work/measurement.json')
    assert command[:2] == [sys.executable, os.path.join(ROOT, 'benchmark.py')]
    args, forwarded = benchmark.parse_args(command[2:])
    assert (args.ngpus, args.batch_sizes, args.benchmark_iters, args.epochs, args.warmup, args.mode) == \
        ([8], [512], 500, 3, 1, 'train')
    assert forwarded == ['--num-examples', '32000', '--data-root', '/data/photos']
    point = benchmark.point_command(args, forwarded, 8, 512, 'point')
    assert point[1:] == ['-n', '8', '-b', '512', '--benchmark-iters', '500', '-e', '3', '--mode', 'train',
                         '--no-metrics', '--workspace', 'point', '--dllogger-log', 'point/dllogger.log',
                         '--num-examples', '32000', '--data-root', '/data/photos']
    args, forwarded = benchmark.parse_args(default.measurement(2, 8, 'cpu', '/d', '/w.json')[2:])
    assert (args.benchmark_iters, args.epochs, args.warmup, args.mode) == (3, 2, 1, 'train')
    assert forwarded[-len(default.TWIN):] == default.TWIN
    # Item 4: on GPUs the float16 step's other order is measured the same way
    other = default.measurement(8, 512, 'gpu', '/data/photos', '/w.json', '--overflow-check', 'before-update')
    assert benchmark.parse_args(other[2:])[1][-2:] == ['--overflow-check', 'before-update']


@pytest.mark.integration
def test_dali_copy_twin_reads_complete_copies(tmp_path):
    """The dali-copy check on CPU outputs: what MXNet reads right after dali.copy_output is DALI's output."""
    result = subprocess.run([sys.executable, SCRIPT, '--device', 'cpu', '--only', 'dali-copy', '--workdir',
                             str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.splitlines()[1].startswith('dali-copy       PASS')
    assert 'max |MXNet - DALI| 0.0 (MXNET_ASYNC_GPU_ENGINE=1, CUDA graphs on)' in result.stdout


@pytest.mark.unit
def test_a_multi_worker_check_passes_only_when_the_workers_said_they_hold_one_model():
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    try:
        import gpu_check_training
    finally:
        sys.path.remove(os.path.join(ROOT, 'scripts'))
    said = ('[Epoch 0] All 2 workers hold the same weights, batchnorm statistics and optimizer state (SHA-256 ab)\n'
            '[Epoch 1] All 2 workers hold the same weights, batchnorm statistics and optimizer state (SHA-256 cd)\n')
    assert gpu_check_training.replicas_agree(said, 2, [0, 1]) == (True, '2 workers hold one model after epochs 0,1')
    assert not gpu_check_training.replicas_agree(said.splitlines()[0], 2, [0, 1])[0]   # epoch 1 unsaid
    assert not gpu_check_training.replicas_agree(said, 4, [0, 1])[0]                   # said by 2 of 4
    assert gpu_check_training.replicas_agree('', 1, [0]) == (True, '')


@pytest.mark.unit
def test_each_gpu_is_named_with_its_capability_against_the_kernels_of_this_mxnet():
    """Issue 57 item 7: the libmxnet.so of the PyPI wheel mxnet-cu112 1.9.1 holds machine code for 5.0, 6.0, 7.0,
    8.0 and 8.6 (198 cubins each) and no PTX, as cuobjdump 13.5 lists it (the listing below, one line per
    architecture). An A100 runs its own; a T4 (7.5) and an L4 (8.9) the machine code of an earlier minor version of
    their architecture; an H100 (9.0) cannot run it, and gpu_check said its driver compiled the PTX. A build with
    PTX would run there after the driver's compilation."""
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    import gpu_check_default as default
    smi = 'NVIDIA A100-SXM4-80GB, 8.0, 81920\nNVIDIA H100 80GB HBM3, 9.0, 81559\n'
    assert default.gpu_facts(smi) == [('NVIDIA A100-SXM4-80GB', '8.0', 81920), ('NVIDIA H100 80GB HBM3', '9.0', 81559)]
    elf = ''.join(f'ELF file {i:4d}: libmxnet.{i}.sm_{arch}.cubin\n' for i, arch in enumerate((50, 60, 70, 80, 86), 1))
    kernels, ptx_versions = default.built_capabilities(elf, '')
    assert kernels == ['5.0', '6.0', '7.0', '8.0', '8.6'] and ptx_versions == []
    assert default.capability_words('8.0', kernels, ptx_versions) == (
        'this MXNet has machine code for 5.0, 6.0, 7.0, 8.0, 8.6 and no PTX: native', True)
    assert default.capability_words('7.5', kernels, ptx_versions)[0].endswith('runs the machine code of 7.0 (same '
                                                                               'architecture)')
    assert default.capability_words('8.9', kernels, ptx_versions)[0].endswith('runs the machine code of 8.6 (same '
                                                                               'architecture)')
    words, runs = default.capability_words('9.0', kernels, ptx_versions)
    assert not runs and 'this GPU cannot run it' in words and 'docs/gpu-paths.md#mxnet-and-gpus' in words
    assert not default.capability_words('10.0', kernels, ptx_versions)[1]
    words, runs = default.capability_words('9.0', kernels, ['8.6'])
    assert runs and "the driver's compilation of the PTX of 8.6" in words and '~/.nv/ComputeCache' in words
    assert default.capability_words('9.0', [], []) == (
        "this MXNet's kernels could not be listed (cuobjdump not found)", True)


@pytest.mark.unit
def test_gpu_check_stops_at_once_where_a_gpu_can_run_none_of_this_mxnets_kernels(monkeypatch, capsys):
    """Every check would fail on its first kernel: one error line after the GPUs' line, exit 2, no check run."""
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    import gpu_check
    import gpu_check_default as default
    import mxnet as mx
    monkeypatch.setattr(mx.context, 'num_gpus', lambda: 8)
    monkeypatch.setattr(gpu_check, 'library_versions', lambda: {'MXNet': '1.9.1'})
    monkeypatch.setattr(default, 'device_line', lambda: ('GPU 0: NVIDIA H100 80GB HBM3, 81559 MiB, ...', False))
    monkeypatch.setattr(gpu_check, 'run_checks', lambda *args: pytest.fail('a check ran'))
    assert gpu_check.main(['--only', 'float16']) == 2
    out, err = capsys.readouterr()
    assert 'GPU 0: NVIDIA H100' in out and err.startswith('error: this MXNet has no kernel these GPUs can run')


class FakeCudaDriver:
    """The CUDA driver API's calls rn50/world/cuda_driver.py makes, for GPUs {PCI bus id: (major, minor)}; each
    returns 0 on success, as CUDA's do, and 101 (CUDA_ERROR_INVALID_DEVICE) for a bus id it does not know."""

    def __init__(self, capabilities):
        self.capabilities, self.bus_ids = capabilities, list(capabilities)

    def cuInit(self, flags):
        return 0

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.bus_ids)
        return 0

    def cuDeviceGetByPCIBusId(self, device, bus_id):
        if bus_id.decode() not in self.bus_ids:
            return 101
        device._obj.value = self.bus_ids.index(bus_id.decode())
        return 0

    def cuDeviceGetAttribute(self, value, attribute, device):
        major, minor = self.capabilities[self.bus_ids[device.value]]
        value._obj.value = {75: major, 76: minor}[attribute]
        return 0


@pytest.mark.unit
def test_the_gpus_are_counted_by_the_cuda_driver_without_mxnet(monkeypatch):
    """The runner's count (rn50/world/cuda_driver.py): the driver's devices; none without a driver, or where it
    fails to start (cuInit's CUDA_ERROR_NO_DEVICE, 100)."""
    from rn50.world import cuda_driver
    driver = FakeCudaDriver({'00000000:3B:00.0': (7, 0), '00000000:5E:00.0': (7, 0)})
    monkeypatch.setattr(cuda_driver, 'library', lambda: driver)
    assert cuda_driver.gpu_count() == 2
    monkeypatch.setattr(driver, 'cuInit', lambda flags: 100)
    assert cuda_driver.gpu_count() == 0
    monkeypatch.setattr(cuda_driver, 'library', lambda: None)
    assert cuda_driver.gpu_count() == 0 and cuda_driver.capability('00000000:3B:00.0') == '?'


@pytest.mark.unit
def test_a_driver_without_nvidia_smis_compute_cap_loses_neither_the_gpu_model_nor_its_capability(tmp_path,
                                                                                                monkeypatch):
    """Issue 57 item 6: nvidia-smi's compute_cap field came with driver R510; the 22.xx containers run on R470,
    whose nvidia-smi refuses the whole query, and gpu_check lost the GPU's model (so the ratio to the original's
    figure) with it. The capability then comes from the CUDA driver API, each GPU found by its PCI bus id (here a
    stand-in for libcuda.so.1 that knows the first GPU only)."""
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    import gpu_check_default as default
    smi = tmp_path / 'nvidia-smi'
    smi.write_text('#!/bin/sh\ncase "$*" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\''
                   '; exit 2;; esac\necho "Tesla V100-SXM2-16GB, 00000000:3B:00.0, 16160"\n'
                   'echo "Tesla V100-SXM2-16GB, 00000000:5E:00.0, 16160"\n')
    smi.chmod(0o755)
    monkeypatch.setenv('PATH', f'{tmp_path}{os.pathsep}{os.environ["PATH"]}')
    from rn50.world import cuda_driver
    monkeypatch.setattr(cuda_driver, 'library', lambda: FakeCudaDriver({'00000000:3B:00.0': (7, 0)}))
    assert default.gpu_model() == ('Tesla V100-SXM2-16GB', 16160)
    assert default.gpu_key(*default.gpu_model()) == 'V100 16GB'
    assert default.query_gpus() == ([('Tesla V100-SXM2-16GB', '7.0', 16160), ('Tesla V100-SXM2-16GB', '?', 16160)], '')
    monkeypatch.setattr(default.shutil, 'which', lambda name: None)     # cuobjdump: where CUDA's tools are not
    line, runnable = default.device_line()
    lines = line.splitlines()
    assert runnable      # without cuobjdump nothing is known against it
    assert lines[0].startswith('GPU 0: Tesla V100-SXM2-16GB, 16160 MiB, compute capability 7.0; ') and \
        lines[1].startswith('GPU 1: Tesla V100-SXM2-16GB, 16160 MiB, compute capability ?; '), lines
    assert default.capability_words('?', ['7.0'], ['7.0']) == (
        'this MXNet has machine code for 7.0 and PTX for 7.0: whether this GPU runs it is not known', True)


@pytest.mark.unit
def test_the_default_check_compares_with_the_originals_figure_at_its_batch_only():
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    import gpu_check_default as default
    assert default.gpu_key('NVIDIA A100-SXM4-80GB', 81920) == 'A100 80GB'
    assert default.gpu_key('Tesla V100-SXM2-16GB', 16160) == 'V100 16GB'
    assert default.gpu_key('Tesla V100-SXM2-32GB', 32510) == 'V100 32GB'
    assert default.gpu_key('NVIDIA A100-SXM4-40GB', 40960) is None        # no published figure
    assert default.gpu_key('NVIDIA H100 80GB HBM3', 81559) is None
    assert default.published('A100 80GB', 8, 512) == 26673.72 and default.published('A100 80GB', 8, 256) is None
    assert default.published('V100 16GB', 2, 192) == 2768 and default.published(None, 8, 192) is None

