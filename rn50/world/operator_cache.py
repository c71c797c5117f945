"""MXNet's operator functions compiled once per machine, not in every process that imports MXNet.

As it imports, MXNet 1.x writes the Python source of a function for each of its operators (mx.nd.Convolution,
mx.sym.FullyConnected, the numpy operators: 2,556 in 1.9.1; `_make_ndarray_function` in mxnet/ndarray/register.py,
`_make_symbol_function` in mxnet/symbol/register.py) and compiles each with exec(): 0.4 s of CPU, two fifths of its
import, in every worker, runner and script (docs/cpu.md). `compiled_once()` keeps the compiled code objects in one
file, CACHE_NAME in the user's cache folder ($XDG_CACHE_HOME, else ~/.cache), as Python keeps a module's byte code in
__pycache__ and matplotlib its font list in ~/.cache/matplotlib; later imports read them instead of compiling.

What runs is exactly what MXNet wrote:
* Each source calls its operator by the address of MXNet's handle, which differs from process to process
  (`return _imperative_invoke(94682214339552, ...)`). The file keeps each function compiled with a stand-in for that
  number, of as many digits (`stand_in`: Python 3.11's code records each expression's columns), under a digest of
  the source so written; each import puts its own handle in the stand-in's place (`with_constant`).
* A source that differs otherwise (another MXNet) has another digest: it is compiled, and the file is written again
  with the code of the MXNet that imported last. A source with no handle, or more than one, is compiled as it is.
* The file is named by Python's byte-code magic number: code objects are readable only by the Python that wrote them.
* A file that cannot be read is compiled over; one that cannot be written is left out. MXNet loads either way, as it
  would without this module.
"""
import contextlib
import hashlib
import importlib.machinery
import importlib.util
import marshal
import os
import re
import sys
import tempfile
import types

GENERATORS = ('mxnet.ndarray.register', 'mxnet.symbol.register')
CACHE_NAME = f'mxnet-operators-{importlib.util.MAGIC_NUMBER.hex()}.marshal'
# The operator's handle in the line that calls it (mxnet/ndarray/register.py, mxnet/symbol/register.py).
HANDLE = re.compile(r'return (_imperative_invoke|_symbol_creator)\((\d+), ')


def cache_path(environ=os.environ):
    """The file of the compiled operators: rn50/CACHE_NAME in $XDG_CACHE_HOME, else in ~/.cache (a relative
    XDG_CACHE_HOME is ignored, as the XDG specification says); None without a home folder (a user id with no
    passwd entry and no HOME), where MXNet then compiles them as it always did."""
    xdg = environ.get('XDG_CACHE_HOME', '')
    folder = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(folder, 'rn50', CACHE_NAME) if os.path.isabs(folder) else None


class Compiler:
    """exec() for MXNet's generated sources, compiling each only when `known` (digest -> code object) lacks it.
    `used` collects the code objects of this import; `compiled` counts the sources compiled here."""

    def __init__(self, known):
        self.known, self.used, self.compiled = known, {}, 0

    def exec_in(self, module_globals):
        """exec(source, globals=None, locals=None) as called in the module of `module_globals`."""
        def cached_exec(source, globals_=None, locals_=None):
            code = self.code(source) if isinstance(source, str) else source
            exec(code, module_globals if globals_ is None else globals_, locals_)
        return cached_exec

    def code(self, source):
        """The code object of `source`, as compile(source, '<string>', 'exec') makes it."""
        handles = HANDLE.findall(source)
        replacement = stand_in(len(handles[0][1])) if len(handles) == 1 else None
        if replacement is None or str(replacement) in source:    # kept, it could not be told from the handle
            self.compiled += 1
            return compile(source, '<string>', 'exec')
        template = HANDLE.sub(lambda call: f'return {call[1]}({replacement}, ', source)
        key = hashlib.blake2b(template.encode(), digest_size=16).digest()
        code = self.known.get(key)
        if code is None:
            code = compile(template, '<string>', 'exec')
            self.compiled += 1
        self.used[key] = code
        return with_constant(code, replacement, int(handles[0][1]))


def stand_in(digits):
    """The number that stands for a handle of `digits` digits in the kept code, of the same width, so that every
    expression keeps its columns; a source that holds it otherwise is compiled as it is."""
    return int(('13579' * 8)[:digits])


def with_constant(code, old, new):
    """`code` with the integer constant `old` made `new`, in it and in the functions it defines."""
    def replaced(constant):
        if isinstance(constant, types.CodeType):
            return with_constant(constant, old, new)
        return new if type(constant) is int and constant == old else constant
    return code.replace(co_consts=tuple(map(replaced, code.co_consts)))


class GeneratorLoader:
    """The loader of one of GENERATORS, giving the module the Compiler's exec() before its code runs (its last
    lines make every operator); everything else is the original loader's."""

    def __init__(self, loader, compiler):
        self.loader, self.compiler = loader, compiler

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.exec = self.compiler.exec_in(module.__dict__)
        self.loader.exec_module(module)


class GeneratorFinder:
    """Finds GENERATORS as the import system would, with a GeneratorLoader around their loader."""

    def __init__(self, compiler):
        self.compiler = compiler

    def find_spec(self, name, path=None, target=None):
        if name not in GENERATORS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = GeneratorLoader(spec.loader, self.compiler)
        return spec


def read(path):
    """{digest: code object} of the file at `path`; {} when it is missing or cannot be read as one."""
    try:
        with open(path, 'rb') as f:
            known = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not isinstance(known, dict):
        return {}
    return {key: code for key, code in known.items() if isinstance(code, types.CodeType)}


def write(path, codes):
    """`codes` to `path`, whole or not at all (a temporary file renamed over it); False where it cannot be written
    (a read-only home, a full disk): the next import compiles again."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix='.' + os.path.basename(path), dir=os.path.dirname(path))
        try:
            with os.fdopen(handle, 'wb') as f:
                marshal.dump(codes, f)
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def compiled_once(path=None):
    """Within it, `import mxnet` takes its operators' code from `path` (cache_path()) and compiles only what the file
    lacks; the file is written again after an import that compiled any, or left entries unused. Yields the Compiler
    (`compiled`: how many sources were compiled). Does nothing where MXNet is already imported."""
    path = cache_path() if path is None else path
    compiler = Compiler(read(path) if path and 'mxnet' not in sys.modules else {})
    finder = GeneratorFinder(compiler)
    sys.meta_path.insert(0, finder)
    try:
        yield compiler
    finally:
        sys.meta_path.remove(finder)
        for name in GENERATORS:     # the modules as the import system alone would have left them
            module = sys.modules.get(name)
            if module is not None and isinstance(module.__spec__.loader, GeneratorLoader):
                module.__dict__.pop('exec', None)
                module.__spec__.loader = module.__loader__ = module.__spec__.loader.loader
    if path and compiler.used and compiler.used.keys() != compiler.known.keys():
        write(path, compiler.used)
