"""The start-up every script in scripts/ shares, in one place: the repository on sys.path, the project's Python,
and (for a script that runs MXNet) this CPU prepared before MXNet loads. A script's own folder is first on
sys.path, so from any script here, before its first third-party import:

    import bootstrap
    bootstrap.start()                   # a script that uses the recipe's code (rn50/, the root's modules)
    bootstrap.start(prepare_cpu=True)   # ... and runs MXNet: cpu.prepare_process(), then cpu.load_mxnet()
    bootstrap.start(tests=True)         # ... and imports helpers of tests/ (checkpoint_formats.py)
    import mxnet as mx  # noqa: E402

`start` puts the repository root first on sys.path (tests/ before it with tests=True), then calls
rn50/launch/interpreter.py's use_project_python: under an interpreter without MXNet (a fresh shell's python3,
or `python -S`) the script runs again with .venv's Python, so this module imports the standard library only.
With prepare_cpu it then calls rn50/world/cpu.py's prepare_process (oneDNN's instruction set, AMX where there
is one, OpenMP threads), which oneDNN and OpenMP read once, as MXNet loads, and loads MXNet (cpu.load_mxnet:
without scikit-learn).

A helper module that only needs the repository importable, without starting anything (fault_tools.py,
gpu_check_training.py), calls `bootstrap.on_path()`.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, 'tests')


def on_path(tests=False):
    """The repository root first on sys.path (rn50/ and the root's modules importable), tests/ before it with
    `tests`."""
    sys.path.insert(0, ROOT)
    if tests:
        sys.path.insert(0, TESTS)


def start(prepare_cpu=False, tests=False):
    """A script's start-up (the module docstring): on_path, the project's Python, and with `prepare_cpu` this
    CPU prepared for MXNet and MXNet loaded. Call it before any third-party import."""
    on_path(tests)
    from rn50.launch import interpreter
    interpreter.use_project_python()   # finds .venv in a fresh shell (runs the script again there)
    if prepare_cpu:
        from rn50.world import cpu
        cpu.prepare_process()   # before MXNet loads: oneDNN's ISA (AMX where there is one), OpenMP threads
        cpu.load_mxnet()        # without scikit-learn
