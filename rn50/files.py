"""Files, written and checked one way for every folder of the package: atomic writes (`atomic_path`: a crash
leaves the old file or the new one, never half of one; every output of the recipe, checkpoints included, is
written through it), strict JSON (`write_json`), a file's SHA-256 (`file_sha256`), the temporaries a killed write
leaves (`remove_stale_temporaries`) and a writable output folder (`check_workspace`). It imports no folder of
rn50/: checkpoints/, reports/ and inference/ write through it.

    with files.atomic_path(path, previous=path + '.prev') as tmp:   # write tmp; renamed over path on success
        mx.nd.save(tmp, arrays)
    files.write_json(path, report)                                  # NaN and inf become null
"""
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile

from rn50.errors import RecipeError, mxnet_message

# What atomic_path's temporary files are called: '.' + the output's name + '.' + mkstemp's 8 characters.
TEMPORARY_NAME = re.compile(r'^\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp$')


@contextlib.contextmanager
def atomic_path(path, previous=None):
    """Yield a temporary path next to `path`; on success it is flushed to disk and renamed over `path` (with
    the permissions a plain open() would give), on failure removed. Readers and crashes see the old file or
    the new one, never half of one. With `previous`, the file being replaced is kept under that name (a hard
    link made before the rename, so `path` exists at every moment). A failed write (full disk, file-size
    limit, read-only folder) is a RecipeError naming the file; the old file stays as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix='.' + os.path.basename(path) + '.', suffix='.tmp')
        os.close(fd)
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        sync_file(tmp)
        if previous is not None and os.path.exists(path):
            keep(path, previous)
        os.replace(tmp, path)
        sync_file(folder)
    except write_errors() as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else mxnet_message(e)
        if not isinstance(e, OSError):   # MXNet's writer does not say why: a full disk shows in the free space
            with contextlib.suppress(OSError):
                reason += f' ({shutil.disk_usage(folder).free / 2**20:.0f} MB free there)'
        raise RecipeError(f'could not write {path}: {reason}. Free space or fix the permissions of {folder}; '
                          'the previous version of the file is unchanged') from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def write_errors():
    """What a failed write raises: OSError, and MXNet's own error when MXNet is loaded (its writers' files are
    written through atomic_path). Without MXNet loaded nothing raises that one: this module never loads it (the
    scripts that only write files, such as prepare_dataset.py, start in a fraction of MXNet's import)."""
    mxnet = sys.modules.get('mxnet')
    return (OSError,) if mxnet is None else (OSError, mxnet.base.MXNetError)


def sync_file(path):
    """fsync a file or a folder (a folder's entry list: makes a rename in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def keep(path, previous):
    """Atomically make `previous` another name of `path`'s current content."""
    # Named like atomic_path's temporaries ('.' + name + 8 characters + '.tmp'), so a kill leaves nothing
    # that remove_stale_temporaries would not clean.
    folder, name = os.path.split(previous)
    staging = os.path.join(folder, f'.{name}.prevlink.tmp')
    if os.path.exists(staging):
        os.remove(staging)
    try:
        os.link(path, staging)
    except OSError:       # a filesystem without hard links: a copy does the same, more slowly
        shutil.copyfile(path, staging)
    os.replace(staging, previous)


def remove_stale_temporaries(folder, prefixes):
    """Delete the temporary files atomic_path leaves behind when a process is killed mid-write, for outputs
    whose names start with one of `prefixes`; returns their names."""
    removed = []
    if not os.path.isdir(folder):
        return removed
    for name in os.listdir(folder):
        match = TEMPORARY_NAME.match(name)
        if match and match.group('target').startswith(prefixes):
            os.remove(os.path.join(folder, name))
            removed.append(name)
    return removed


def check_workspace(folder, flag='--workspace'):
    """RecipeError unless `folder` (given by `flag`) is (or can be made) a writable directory: checked before
    any work, so a run never computes for hours and then fails to save."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise RecipeError(f'{flag} {folder} is a file, not a folder: pass a folder path')
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix='.write-check.')
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise RecipeError(f'{flag} {folder} is not writable ({e.strerror or e}): pass a folder you can '
                          'write to') from e



def finite_or_none(value):
    """`value` with every NaN or infinite float inside it replaced by None (JSON null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def file_sha256(path):
    """SHA-256 of a file's content, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def write_json(path, obj):
    """Strict JSON, written atomically; NaN and infinite floats become null."""
    with atomic_path(path) as tmp, open(tmp, 'w') as f:
        f.write(json.dumps(finite_or_none(obj), indent=2, allow_nan=False) + '\n')
