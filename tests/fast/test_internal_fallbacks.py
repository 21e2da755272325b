"""Internal fallbacks leave a log record naming the component; findings show without core importing report."""

import ast
import logging
import pathlib

import gradguard
from gradguard.core.internal import log_fallback

SRC = pathlib.Path(gradguard.__file__).parent


def test_fallback_is_a_debug_record_naming_the_component(caplog):
    with caplog.at_level(logging.DEBUG, logger="gradguard"):
        log_fallback("backends.torch", "reading a storage pointer", RuntimeError("no storage"))
    (record,) = caplog.records
    assert record.name == "gradguard.backends.torch"
    assert record.levelno == logging.DEBUG
    assert record.getMessage() == "reading a storage pointer failed; falling back (RuntimeError: no storage)"


def test_core_imports_neither_a_framework_nor_report():
    banned = {"torch", "paddle", "mindspore", "triton"}
    for path in (SRC / "core").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in banned, f"{path.name} imports {name}"
                assert "report" not in name.split("."), f"{path.name} imports {name}"


def test_a_finding_renders_through_the_registered_views():
    import gradguard.report
    from gradguard.core.findings import Finding, TensorInfo

    finding = Finding(kind="inplace_modification", tensor=TensorInfo((2,), "float32"))
    assert str(finding) == gradguard.report.render_finding(finding)
    bundle = finding._repr_mimebundle_()
    assert bundle["text/plain"] == str(finding)
    assert bundle["text/html"].strip()


_REPORTERS = {"log_fallback", "warn", "warning", "debug", "info", "error", "exception"}


def _handler_is_silent(handler: ast.ExceptHandler) -> bool:
    """A broad handler is silent when it neither re-raises, nor uses the error, nor logs or warns."""
    for statement in handler.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Raise):
                return False
            if handler.name and isinstance(node, ast.Name) and node.id == handler.name:
                return False
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in _REPORTERS:
                    return False
    return True


def test_no_broad_except_is_silent():
    # Issue 18: an internal failure must leave a trace naming the component (a warning or a log record), or be
    # turned into something the user sees (the error object used); a bare `except Exception: pass` hid a
    # whole-guard failure on newer torch once.
    silent = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ExceptHandler):
                continue
            caught = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)} if node.type else {"bare"}
            if caught & {"Exception", "BaseException", "bare"} and _handler_is_silent(node):
                silent.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert silent == []
