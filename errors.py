"""The one exception type for problems a user can fix.

Raise `RecipeError` for a bad flag combination, a missing or corrupt file, a wrong shape, or a request this
machine cannot honour (e.g. `--data-backend dali-gpu` without a GPU). The message says what is wrong and what
to do about it; `train.py` prints it as `error: <message>` without a traceback and exits with status 2.
"""


class RecipeError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""
