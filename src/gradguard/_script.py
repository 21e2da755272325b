"""The program ``gradguard run`` executes: a script path or ``-m module``, run as the real ``__main__``; and the
argument checks and usage errors shared by ``gradguard run``, ``fix`` and ``advise``, made before anything runs: a
typo in a report path must cost no training run, and a report must never be written over the user's own files.

# NOTE [The script is the real __main__]
# Pickle finds a class by ``sys.modules[cls.__module__]``: a script's classes live in ``__main__``, so
# ``torch.save(model)``, multiprocessing (fork and spawn), spawn ``Process`` / ``DataLoader`` and a DataLoader
# worker returning a script-defined class all need ``sys.modules["__main__"]`` to *be* the script's module.
# Executing the code in a private dict (as gradguard once did) leaves gradguard's own ``__main__`` there:
# pickling fails, and a DataLoader worker whose batch cannot be unpickled hangs the parent forever. So we do
# what ``python script.py`` / ``python -m mod`` (runpy) do: a fresh ``types.ModuleType("__main__")`` installed
# in ``sys.modules`` for the rest of the process, with ``__file__`` / ``__spec__`` as Python sets them (spawn
# children re-import the main module from these).
#
# NOTE [What python runs]
# ``python PATH`` runs a file; a directory or a zip archive (a zipapp) whose ``__main__.py`` it imports with
# PATH first on sys.path (runpy.run_path's rule: PATH has an importer); ``python -`` the source read from stdin,
# compiled as ``<stdin>``, with '' first on sys.path. gradguard follows the same rules, so whatever python
# starts, ``gradguard run`` starts the same way.
"""

from __future__ import annotations

import argparse
import builtins
import os
import runpy
import sys
import traceback
import types
from dataclasses import dataclass, field

__all__ = ["Program", "ProgramError", "load_program", "trim_traceback", "format_user_exception",
           "call_users_excepthook", "seconds", "report_path_problem", "program_target", "load", "syntax_error",
           "usage_error"]


class ProgramError(Exception):
    """The program cannot be started; ``str()`` is the message Python would print, ``exit_code`` its status."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class _ModuleNotRunnable(ImportError):
    pass


@dataclass
class Program:
    """What to run: ``target`` as the user typed it (a path, or a module name when ``is_module``)."""

    target: str
    is_module: bool
    origin: str  # absolute path of the file executed
    code: types.CodeType
    spec: object = None
    args: list = field(default_factory=list)
    keep: list = field(default_factory=list)
    stdin_source: bytes | None = None  # ``gradguard run -``: the source read from stdin (a re-run needs it again)

    @property
    def command_words(self) -> list[str]:
        """How to name this program again on a command line (``-m mod``, the path, or ``-``)."""
        return ["-m", self.target] if self.is_module else [self.target]

    @property
    def input_files(self) -> list[str]:
        """The files this program is read from (a report must never overwrite one)."""
        if self.stdin_source is not None:
            return []
        candidates = [self.origin] + ([] if self.is_module else [os.path.abspath(self.target)])  # a zip archive
        return [path for path in dict.fromkeys(candidates) if os.path.isfile(path)]

    def install_main(self, args: list[str]) -> dict:
        """Make this program the process's ``__main__`` (argv, sys.path[0], sys.modules); its globals."""
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = builtins  # the module, as in Python's own __main__ (not a dict)
        spec = self.spec  # -m module, or a directory / zip archive's __main__; else None
        module.__dict__.update(__file__=self.origin, __cached__=getattr(spec, "cached", None),
                               __loader__=getattr(spec, "loader", None), __package__=getattr(spec, "parent", None),
                               __spec__=spec)
        if self.stdin_source is not None:  # ``python -``: origin is "<stdin>"
            from importlib.machinery import BuiltinImporter

            module.__dict__["__loader__"] = BuiltinImporter
        sys.argv = [self.origin if self.is_module else self.target, *args]
        self.keep.append(sys.modules.get("__main__"))  # gradguard's own __main__ stays alive (its frame runs)
        sys.modules["__main__"] = module
        return module.__dict__


def load_program(target: str, is_module: bool) -> Program:
    """Find and compile the program; a ProgramError with Python's own words when it cannot start."""
    if is_module:
        # `python -m`: the current directory first on sys.path, then the module found as runpy finds it
        # (packages run their __main__). runpy._get_module_details is what pdb uses for `-m` too.
        sys.path[0] = os.getcwd()
        try:
            _name, spec, code = runpy._get_module_details(target, _ModuleNotRunnable)
        except _ModuleNotRunnable as error:
            raise ProgramError(f"{sys.executable}: {error}", 1) from None
        return Program(target, True, os.path.abspath(spec.origin), code, spec)
    if target == "-":
        source = sys.stdin.buffer.read()
        code = compile(source, "<stdin>", "exec")
        sys.path[0] = ""
        return Program(target, False, "<stdin>", code, stdin_source=source)
    path = os.path.abspath(target)
    from pkgutil import get_importer

    if os.path.exists(path) and get_importer(path) is not None:  # a directory or zip archive with __main__.py
        sys.path[0] = path
        try:
            _name, spec, code = runpy._get_main_module_details(_ModuleNotRunnable)
        except _ModuleNotRunnable as error:
            raise ProgramError(f"gradguard: {error}", 1) from None
        return Program(target, False, spec.origin, code, spec)  # like `python script.py` since 3.9: code and __file__ use the absolute path
    if not os.path.isfile(path):
        # The same words and exit code as `python missing.py`.
        raise ProgramError(f"gradguard: can't open file {path!r}: [Errno 2] No such file or directory", 2)
    from ._overlay import overlay_source

    source = overlay_source(path)  # `gradguard fix` verifying an edit: the edited text, not the file's
    if source is None:
        with open(path, "rb") as handle:
            source = handle.read()
    code = compile(source, path, "exec")  # a SyntaxError is reported by the caller, like Python's
    sys.path[0] = os.path.dirname(path)
    return Program(target, False, path, code)


# -- tracebacks trimmed to the user's frames: gradguard's own frames and runpy's are plumbing
_GRADGUARD_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _is_plumbing(filename: str) -> bool:
    return filename.startswith(_GRADGUARD_DIR) or filename in ("<frozen runpy>",) or filename.endswith(
        os.sep + "runpy.py"
    )


def trim_traceback(tb: types.TracebackType | None, *, drop_library: bool = False) -> types.TracebackType | None:
    """The same traceback without gradguard/runpy frames (and, with ``drop_library``, without library frames)."""
    from .core.frames import LIBRARY_PATHS

    entries = []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not _is_plumbing(filename) and not (drop_library and LIBRARY_PATHS.is_library(filename)):
            entries.append(tb)
        tb = tb.tb_next
    head = None
    for entry in reversed(entries):
        head = types.TracebackType(head, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return head


def _trim_chain(error: BaseException) -> None:
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = trim_traceback(current.__traceback__)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def format_user_exception(error: BaseException) -> str:
    """Format like Python's default hook, with plumbing frames removed from every exception in the chain."""
    _trim_chain(error)
    return "".join(traceback.format_exception(error))


def call_users_excepthook(error: BaseException) -> bool:
    """Hand an uncaught ``error`` to the ``sys.excepthook`` the script installed (rich's traceback, Sentry,
    loguru), as python does; False when the hook is Python's own (the caller prints the traceback itself).

    The hook gets the trimmed traceback. If the hook raises, the two errors are printed as Python prints them.
    """
    hook = sys.excepthook
    if hook is sys.__excepthook__:
        return False
    _trim_chain(error)
    try:
        hook(type(error), error, error.__traceback__)
    except BaseException as failure:  # Python's words when a hook fails (sys.excepthook's documentation)
        sys.stderr.write("Error in sys.excepthook:\n" + "".join(traceback.format_exception(failure))
                         + "\nOriginal exception was:\n" + "".join(traceback.format_exception(error)))
    return True


# -- the command line's checks, before anything runs
def seconds(text: str) -> float:
    """argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def report_path_problem(options, files: list[str], args: list[str], rename=None) -> str | None:
    """Why one of the report files ``options.json`` and ``options.html`` (each through ``rename``) cannot be
    written, naming the argument, what it expects and what it was given; None when all can. A report never
    overwrites a file the program reads: its ``files`` (the script) and the files among its ``args``."""
    targets = [(f"--{name}", rename(path) if rename else path) for name in ("json", "html")
               if (path := getattr(options, name, None))]
    inputs = [*files, *(arg for arg in args if os.path.isfile(arg))]
    if len(targets) == 2 and os.path.abspath(targets[0][1]) == os.path.abspath(targets[1][1]):
        return (f"{targets[0][0]} and {targets[1][0]} name the same file {targets[0][1]!r}: each report needs its "
                "own file")
    for flag, path in targets:
        full = os.path.abspath(path)
        if os.path.isdir(full):
            return f"argument {flag}: expected a file name, got {path!r}, which is a directory"
        folder = os.path.dirname(full)
        if not os.path.isdir(folder):
            return (f"argument {flag}: expected a file in an existing directory, got {path!r} (the directory "
                    f"{folder!r} does not exist; create it or choose another path)")
        if not os.access(folder, os.W_OK) or (os.path.exists(full) and not os.access(full, os.W_OK)):
            return f"argument {flag}: expected a writable file, got {path!r}, which is not writable"
        for source in inputs:
            if os.path.exists(full) and os.path.exists(source) and os.path.samefile(full, source):
                return (f"argument {flag}: expected a new report file, got {path!r}, which is the file being run "
                        "or one of its arguments; gradguard never writes a report over an input file (did you "
                        "swap the arguments?)")
    return None


def program_target(options) -> tuple[str, list[str], bool] | str:
    """(target, its arguments, is_module) from ``script [args]`` or ``-m MODULE [args]``, else the usage error."""
    if options.module is not None:
        if not options.module:
            return "argument -m: expected a module name"
        return options.module[0], options.module[1:], True
    if options.script is None:
        return "the following arguments are required: script (or -m MODULE)"
    return options.script, list(options.args), False


def syntax_error(error: SyntaxError, message: str | None = None) -> int:
    """Say on stderr that the program does not compile (Python's own words unless ``message``); exit status 1."""
    sys.stderr.write("".join(traceback.format_exception_only(type(error), error)) if message is None else message)
    return 1


def load(target: str, is_module: bool, syntax_message=None):
    """The loaded program, or the exit status after saying why it cannot start: Python's own words (the same
    "can't open file" as ``python``), or ``syntax_message(error)`` for a SyntaxError when given."""
    try:
        return load_program(target, is_module)
    except ProgramError as error:
        print(error, file=sys.stderr)
        return error.exit_code
    except SyntaxError as error:
        return syntax_error(error, syntax_message(error) if syntax_message else None)


def usage_error(usage: str, prog: str, message: str) -> int:
    """The ``usage`` line and ``PROG: error: MESSAGE`` on stderr, as argparse says a usage error; exit status 2."""
    from .report.text import wrap_notice

    sys.stderr.write(usage + wrap_notice(message, prefix=f"{prog}: error: "))
    return 2
