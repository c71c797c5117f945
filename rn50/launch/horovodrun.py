"""horovodrun for the runner's launches, without the MXNet import its build check costs.

    python rn50/launch/horovodrun.py -np 2 --gloo python train.py ...    # runs as `horovodrun -np 2 --gloo ...`

Before it starts a worker, horovodrun asks whether Horovod was built with Gloo (with --gloo; and with MPI, then
Gloo, without it) by importing horovod.tensorflow, horovod.torch and horovod.mxnet in a forked child until one
loads (horovod/common/util.py, `_check_extension_lambda`): horovod.mxnet loads MXNet, 2.5 s of a core on the
machines of docs/performance.md, and a CUDA build's libraries, spent before any worker starts. The answers are
two C functions of the MXNet extension's library, horovod_gloo_built and horovod_mpi_built, which this script
reads through ctypes in a process of its own (0.3 s; the library loads libmxnet.so, which horovodrun's process,
the parent of every worker, never holds) and gives to horovodrun's own launcher in place of its checks. Where
the library cannot be read that way, horovodrun checks as it always did. Everything else is horovodrun's: its
flags, its output, its exit status.
"""
import os
import subprocess
import sys

# Run with the library's path: its two answers, "gloo mpi" as 0 or 1.
READ_BUILD = ('import ctypes, sys\n'
              'library = ctypes.CDLL(sys.argv[1])\n'
              'print(int(library.horovod_gloo_built()), int(library.horovod_mpi_built()))\n')


def extension_library():
    """The path of Horovod's MXNet extension (horovod/mxnet/mpi_lib*.so), or None."""
    import horovod
    folder = os.path.join(os.path.dirname(horovod.__file__), 'mxnet')
    names = sorted(name for name in os.listdir(folder) if name.startswith('mpi_lib') and name.endswith('.so')) \
        if os.path.isdir(folder) else []
    return os.path.join(folder, names[0]) if names else None


def build_answers():
    """{'gloo_built': bool, 'mpi_built': bool} from the MXNet extension's library, or {} where it cannot be
    read (no library, a library that does not load alone, an older Horovod without the functions)."""
    library = extension_library()
    if library is None:
        return {}
    result = subprocess.run([sys.executable, '-c', READ_BUILD, library], capture_output=True, text=True)
    answers = result.stdout.split()
    if result.returncode != 0 or len(answers) != 2 or set(answers) - {'0', '1'}:
        return {}
    return {'gloo_built': answers[0] == '1', 'mpi_built': answers[1] == '1'}


def main():
    try:
        from horovod.runner import launch
    except ImportError as e:
        print(f'error: Horovod is not installed for {sys.executable} ({e}): make setup', file=sys.stderr)
        return 2
    for name, built in build_answers().items():
        if hasattr(launch, name):      # the names horovodrun's launcher calls them by
            setattr(launch, name, lambda verbose=False, built=built: built)
    sys.argv[0] = 'horovodrun'         # its usage and messages name it
    return launch.run_commandline()


if __name__ == '__main__':
    sys.exit(main())
