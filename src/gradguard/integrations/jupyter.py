"""Jupyter / IPython: an uncaught gradguard error in a cell shows the finding as HTML, with cell names.

Register once per kernel, with either::

    %load_ext gradguard
    gradguard.integrations.jupyter.register()

# NOTE [notebook exception handler]
# IPython lets one handler take over chosen exception types (``InteractiveShell.set_custom_exc``). For a
# ``GradientHazardError`` ours displays the finding (``text/html`` with the autograd graph, ``text/plain``
# for consoles), then the traceback as IPython formats it, whose message is only the headline (the finding
# is right above it). The kernel stores a cell's code in a file such as ``/tmp/ipykernel_123/456.py``; the
# finding names those files as IPython's traceback does, ``Cell In[3]``. Any other exception keeps IPython's
# own traceback. If showing the finding fails, IPython's plain traceback is shown and the failure is logged
# on the ``gradguard.integrations.jupyter`` logger: the user's error is never hidden.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from .._errors import GradientHazardError, InvalidArgument
from .._script import trim_traceback
from ..core.findings import Finding, display_path
from ..report.text import render_finding

__all__ = ["register", "unregister", "with_cell_names"]

_log = logging.getLogger("gradguard.integrations.jupyter")


def _shell(ipython):
    if ipython is not None:
        return ipython
    try:
        from IPython import get_ipython
    except ImportError as error:
        raise InvalidArgument("gradguard.integrations.jupyter.register() needs IPython: install it with "
                              "`pip install gradguard[jupyter]`") from error
    shell = get_ipython()
    if shell is None:
        raise InvalidArgument("gradguard.integrations.jupyter.register(ipython=None): no IPython shell is running "
                              "here; call it from a notebook or IPython, or pass the shell")
    return shell


def _cell_label(shell, filename: str) -> str | None:
    """``Cell In[3]`` for the file IPython compiled cell 3 into, None for any other file."""
    compiler = getattr(shell, "compile", None)
    format_code_name = getattr(compiler, "format_code_name", None)
    if format_code_name is not None:
        named = format_code_name(filename)
        return f"{named[0]} {named[1]}" if named else None
    number = getattr(compiler, "_filename_map", {}).get(filename)
    return f"Cell In[{number}]" if number is not None else None


def _replace_text(value: Any, mapping: dict[str, str]) -> Any:
    if isinstance(value, str):
        for old, new in mapping.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, dict):
        return {k: _replace_text(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_text(v, mapping) for v in value]
    return value


def with_cell_names(finding, shell):
    """A copy of ``finding`` whose cell files read ``Cell In[n]`` (everywhere: locations, text, graph)."""
    data = finding.to_dict()
    files = {site.get("file") for site in [data["saved_at"], *data["modified_at"]] if site.get("file")}
    mapping = {}
    for file in sorted(files, key=len, reverse=True):
        label = _cell_label(shell, file)
        if label:
            mapping[file] = label
            mapping.setdefault(display_path(file), label)
    return Finding.from_dict(_replace_text(data, mapping)) if mapping else finding


def _show_gradguard_error(shell, etype, value, tb, tb_offset=None):
    """IPython custom exception handler (see the NOTE above). Returns the structured traceback shown."""
    finding = getattr(value, "finding", None)
    if finding is None:  # a GradguardError without a finding (InvalidArgument ...): IPython's own traceback
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None
    try:
        from IPython.display import display

        from ..report.html import notebook_html

        shown = with_cell_names(finding, shell)
        display({"text/html": notebook_html(shown), "text/plain": render_finding(shown)}, raw=True)
        # The same type, message shortened to the headline. Not copy.copy: that would call __init__ with the text.
        short = etype.__new__(etype)
        short.args = (f"{shown.headline or shown.kind} (gradguard's finding is shown above; "
                      "the exception's .finding holds it)",)
        short.finding = finding
        user_tb = trim_traceback(tb, drop_library=True)  # the user's frames, as ``gradguard run`` shows them
        stb = shell.InteractiveTB.structured_traceback(etype, short, user_tb or tb,
                                                       tb_offset=0 if user_tb else tb_offset)
        shell._showtraceback(etype, short, stb)
        return stb
    except Exception as error:  # never hide the user's error behind ours: IPython's traceback instead
        _log.warning("gradguard: the notebook view of %s failed (%s: %s); showing the plain traceback",
                     etype.__name__, type(error).__name__, error, exc_info=True)
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None


def register(ipython=None) -> None:
    """Show gradguard's findings as HTML when a cell raises a gradient hazard error (this kernel, from now on).

    ``ipython``: the shell (default: the running one). Idempotent. IPython has one custom exception handler
    per shell: if another library installed one, it is left in place and a warning says so.
    """
    shell = _shell(ipython)
    current = getattr(shell, "custom_exceptions", ())
    if current and current != (GradientHazardError,):
        warnings.warn(f"gradguard: IPython already has a custom exception handler for {current!r}; gradguard's "
                      "notebook view is not registered (IPython keeps one handler per shell)", stacklevel=2)
        return
    shell.set_custom_exc((GradientHazardError,), _show_gradguard_error)


def unregister(ipython=None) -> None:
    """Remove gradguard's handler (IPython's own traceback again)."""
    shell = _shell(ipython)
    if getattr(shell, "custom_exceptions", ()) == (GradientHazardError,):
        shell.set_custom_exc((), None)
