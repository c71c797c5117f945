"""The one exception type for problems a user can fix.

Raise `RecipeError` for a bad flag combination, a missing or corrupt file, a wrong shape, or a request this
machine cannot honour (e.g. `--data-backend dali-gpu` without a GPU). The message says what is wrong and what
to do about it; `train.py` prints it as `error: <message>` without a traceback and exits with status 2.
`mxnet_message` turns an MXNet exception into the one line of it that explains, for such messages.
"""
import re


class RecipeError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""


def mxnet_message(error):
    """The meaningful line of an MXNet error, whose text starts with 'Traceback ...' and C++ file lines:
    'Check failed: fi->Read(data): Invalid NDArray file format' -> 'Invalid NDArray file format',
    'Check failed: std: :fwrite(ptr, 1, size, fp_) == size: FileStream.Write incomplete' (a full disk) ->
    'FileStream.Write incomplete'."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(('Traceback', 'File ', '[bt]', 'Stack trace'))]
    if not lines:
        return type(error).__name__
    line = re.sub(r'^\w*(Error|FileSystem):\s*', '', lines[-1])
    # The checked expression may hold '::', which MXNet prints as ': :' (std: :fwrite).
    return re.sub(r'^Check failed: (?:[^:]|::|: :)*:\s*', '', line) or lines[-1]
