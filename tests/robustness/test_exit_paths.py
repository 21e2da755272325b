"""How a program leaves: its own ``sys.excepthook`` (rich's traceback, Sentry, loguru) is called as under python,
and a finding recorded before ``os._exit`` is in the JSON report."""

import json
import subprocess
import sys
import textwrap

import pytest

HOOK = textwrap.dedent("""
    import sys
    import torch

    def hook(kind, error, tb):
        print("hook:", issubclass(kind, {kind}), "{words}" in str(error), tb is not None)

    sys.excepthook = hook
    print("start")
    {body}
""")

CASES = {
    "own_error": dict(kind="ValueError", words="bad value", body="raise ValueError('bad value')"),
    "gradient_hazard": dict(kind="RuntimeError", words="modified by an inplace operation", body=textwrap.dedent("""
        x = torch.randn(3, requires_grad=True)
        y = x.exp()
        y += 1
        y.sum().backward()
    """)),
}


def _run(command, cwd):
    return subprocess.run([sys.executable, *command], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_scripts_excepthook_is_called(tmp_path, case):
    (tmp_path / "prog.py").write_text(HOOK.format(**CASES[case]))
    plain = _run(["prog.py"], tmp_path)
    guarded = _run(["-m", "gradguard", "run", "--no-rerun", "prog.py"], tmp_path)
    assert plain.stdout == "start\nhook: True True True\n", plain.stderr
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout) == (1, plain.stdout), \
        guarded.stderr


OS_EXIT = textwrap.dedent("""
    import os
    import torch

    x = torch.randn(3, requires_grad=True)
    y = x.exp()
    y += 1
    try:
        y.sum().backward()
    except RuntimeError:
        print("caught", flush=True)
        os._exit(3)
""")


def test_a_finding_before_os_exit_is_in_the_json_report(tmp_path):
    (tmp_path / "prog.py").write_text(OS_EXIT)
    plain = _run(["prog.py"], tmp_path)
    guarded = _run(["-m", "gradguard", "run", "--json", "out.json", "prog.py"], tmp_path)
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout) == (3, "caught\n")
    findings = json.loads((tmp_path / "out.json").read_text())["findings"]
    assert [(f["kind"], f["tensor"]["name"]) for f in findings] == [("inplace_modification", "y")]
