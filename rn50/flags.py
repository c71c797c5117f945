"""Value types for the command-line flags of every entry point (train.py, runner, benchmark.py).

Each function here is an argparse `type=`: it turns the text of one flag into a value or rejects it with a
message that says what is allowed, so a bad value stops the program at parse time with argparse's usual
`error:` line and exit status 2, before any worker, file or model exists.

    group.add_argument('--batch-size', type=flags.integer(minimum=1), default=192)
    group.add_argument('--lr', type=flags.real(minimum=0, exclusive=True), default=0.1)
    group.add_argument('--run-epochs', type=flags.integer(minimum=1, sentinel=-1), default=-1)

Floats are always finite: `nan` and `inf` are rejected for every flag.

Below every folder of rn50/ (data/, optim/, training/ and config/ declare their flags with these types) and
importing nothing but the standard library, no MXNet: the runner and benchmark.py parse with it at once.
"""
import argparse
import math


def integer(minimum=None, maximum=None, sentinel=None):
    """An int in [minimum, maximum]; `sentinel` is one more allowed value with a special meaning (e.g. -1)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f'{text!r} is not a whole number') from None
        if value != sentinel:
            check_range(value, minimum, maximum, False, sentinel)
        return value
    parse.__name__ = 'integer'
    return parse


def real(minimum=None, maximum=None, exclusive=False):
    """A finite float in [minimum, maximum]; with `exclusive`, `minimum` itself is not allowed."""
    def parse(text):
        value = finite_float(text)
        check_range(value, minimum, maximum, exclusive, None)
        return value
    parse.__name__ = 'real'
    return parse


def check_range(value, minimum, maximum, exclusive, sentinel):
    too_low = minimum is not None and (value <= minimum if exclusive else value < minimum)
    too_high = maximum is not None and value > maximum
    if not (too_low or too_high):
        return
    if minimum is not None and maximum is not None:
        allowed = f'from {minimum} ({"excluded" if exclusive else "included"}) to {maximum}'
    elif minimum is not None:
        allowed = f'{">" if exclusive else "at least"} {minimum}'
    else:
        allowed = f'at most {maximum}'
    if sentinel is not None:
        allowed += f', or {sentinel}'
    raise argparse.ArgumentTypeError(f'{value} is out of range: expected {allowed}')


def finite_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a number') from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f'{text!r} is not a finite number')
    return value


def optional_float(text):
    """A finite float, or None for the text 'None' (a documented value of --min-random-aspect-ratio)."""
    return None if text.lower() == 'none' else finite_float(text)


def int_list(text):
    """'0,2,5' -> [0, 2, 5] (empty items are skipped); every value at least 0."""
    return [integer(minimum=0)(item) for item in text.split(',') if item.strip() != '']


def positive_int_list(text):
    """'1,4,8' -> [1, 4, 8]; at least one value, each at least 1."""
    values = [integer(minimum=1)(item) for item in text.split(',') if item.strip() != '']
    if not values:
        raise argparse.ArgumentTypeError('expected one or more whole numbers, e.g. 1,4,8')
    return values


def float_list(text):
    """'30,60' -> [30.0, 60.0] (empty items are skipped); every value at least 0."""
    return [real(minimum=0)(item) for item in text.split(',') if item.strip() != '']


def int_tuple(text):
    return tuple(integer()(item) for item in text.split(','))


def float_tuple(text):
    return tuple(finite_float(item) for item in text.split(','))


def image_shape(text):
    """'C,H,W' with C = 3, or 4 for a zero 4th channel, and H, W at least 1."""
    shape = int_tuple(text)
    if len(shape) != 3 or shape[0] not in (3, 4) or min(shape) < 1:
        raise argparse.ArgumentTypeError(f'{text!r}: expected C,H,W with C = 3, or 4 for a zero 4th channel')
    return shape


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with HelpFormatter, whose error is one `error:` line naming --help: argparse printed the
    whole usage first (94 lines for train.py) and the error after it."""

    def __init__(self, **kwargs):
        super().__init__(formatter_class=HelpFormatter, **kwargs)

    def error(self, message):
        self.exit(2, f'error: {message} ({self.prog} --help lists the flags)\n')


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each flag's default said once: argparse's "(default: X)" is added only where the help
    text does not already speak of its default, and never for None or an off switch (it would contradict
    texts such as "default: float16 on GPU, float32 on CPU")."""

    def _get_help_string(self, action):
        text = action.help or ''
        if 'default' in text.lower() or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)
