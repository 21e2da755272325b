"""What python runs, gradguard runs the same way: a zip archive (zipapp), a directory with ``__main__.py`` and a
program read from stdin (``-``); same exit code, same stdout (gradients printed exactly)."""

import subprocess
import sys
import textwrap
import zipapp

import pytest

PROGRAM = textwrap.dedent("""
    import sys
    import torch

    torch.manual_seed(0)
    w = torch.randn(3, requires_grad=True)
    (w.sigmoid() * w).sum().backward()
    print(__name__, __file__.replace("\\\\", "/").rsplit("/", 2)[-2:], sys.argv[1:], repr(sys.path[0])[-12:])
    print([float(g).hex() for g in w.grad])
    sys.exit(int(sys.argv[1]))
""")

HAZARD = textwrap.dedent("""
    import torch

    x = torch.randn(3, requires_grad=True)
    y = x.exp()
    y += 1
    y.sum().backward()
""")


def _run(command, cwd, stdin=None):
    return subprocess.run([sys.executable, *command], cwd=cwd, capture_output=True, text=True, timeout=300,
                          input=stdin)


@pytest.fixture()
def forms(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(PROGRAM)
    zipapp.create_archive(tmp_path / "app", tmp_path / "app.pyz")
    return tmp_path


@pytest.mark.parametrize("target", ["app.pyz", "app"])
def test_zipapp_and_directory(forms, target):
    plain = _run([target, "3"], forms)
    assert plain.returncode == 3, plain.stderr
    guarded = _run(["-m", "gradguard", "run", target, "3"], forms)
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout), guarded.stderr


def test_program_from_stdin(tmp_path):
    plain = _run(["-", "4"], tmp_path, stdin=PROGRAM.replace('__file__.replace("\\\\", "/").rsplit("/", 2)[-2:]',
                                                              "__file__"))
    assert plain.returncode == 4, plain.stderr
    guarded = _run(["-m", "gradguard", "run", "-", "4"], tmp_path,
                   stdin=PROGRAM.replace('__file__.replace("\\\\", "/").rsplit("/", 2)[-2:]', "__file__"))
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout), guarded.stderr
    assert "<stdin>" in guarded.stdout


def test_hazard_read_from_stdin_is_diagnosed_and_its_writer_named(tmp_path):
    import json

    guarded = _run(["-m", "gradguard", "run", "--json", "out.json", "-"], tmp_path, stdin=HAZARD)
    assert guarded.returncode == 1, guarded.stderr
    findings = json.loads((tmp_path / "out.json").read_text())["findings"]
    assert [f["kind"] for f in findings] == ["inplace_modification"]
    assert [w["line"] for w in findings[0]["modified_at"]] == [6]  # the re-run got the source again
