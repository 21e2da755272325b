"""`gradguard run script.py args...` behaves exactly like `python script.py args...` for everything that is
not a gradient hazard: same exit code, same stdout, the user's own traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PYTHON = sys.executable
GRADGUARD = [PYTHON, "-m", "gradguard"]


def _run(cmd, cwd):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def _script(tmp_path, body: str, name: str = "script.py") -> str:
    (tmp_path / name).write_text(textwrap.dedent(body))
    return name


def _both(tmp_path, name, *args):
    plain = _run([PYTHON, name, *args], tmp_path)
    guarded = _run([*GRADGUARD, "run", name, *args], tmp_path)
    return plain, guarded


def test_missing_script(tmp_path):
    result = _run([*GRADGUARD, "run", "nope.py"], tmp_path)
    assert result.returncode == 2
    assert result.stderr == f"gradguard: can't open file '{tmp_path / 'nope.py'}': [Errno 2] No such file or directory\n"


def test_syntax_error_reported_like_python(tmp_path):
    name = _script(tmp_path, "x = 1\ndef broken(:\n    pass\n")
    plain, guarded = _both(tmp_path, name)
    assert guarded.returncode == plain.returncode == 1
    assert guarded.stderr == plain.stderr
    assert "SyntaxError" in guarded.stderr


def test_exit_code_and_argv_and_main(tmp_path):
    name = _script(
        tmp_path,
        """
        import sys
        print(__name__, sys.argv)
        sys.exit(int(sys.argv[1]))
        """,
    )
    plain, guarded = _both(tmp_path, name, "3", "--flag")
    assert guarded.returncode == plain.returncode == 3
    assert guarded.stdout == plain.stdout == "__main__ ['script.py', '3', '--flag']\n"


def test_users_own_error_passes_through_with_their_traceback(tmp_path):
    name = _script(
        tmp_path,
        """
        def helper(d):
            return d["missing"]

        print("before")
        helper({})
        """,
    )
    plain, guarded = _both(tmp_path, name)
    assert guarded.returncode == plain.returncode == 1
    assert guarded.stdout == plain.stdout == "before\n"
    assert guarded.stderr == plain.stderr
    assert "gradguard" not in guarded.stderr


def test_clean_script_writes_empty_json(tmp_path):
    name = _script(
        tmp_path,
        """
        import torch
        x = torch.randn(3, requires_grad=True)
        x.sigmoid().sum().backward()
        print("done")
        """,
    )
    result = _run([*GRADGUARD, "run", "--json", "out.json", name], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert json.loads((tmp_path / "out.json").read_text())["findings"] == []


def test_hazard_exit_code_json_and_report(tmp_path):
    name = _script(
        tmp_path,
        """
        import torch
        x = torch.randn(3, requires_grad=True)
        y = x.sigmoid()
        y.mul_(2)
        y.sum().backward()
        """,
    )
    plain, guarded = _both(tmp_path, name)
    assert plain.returncode == 1 and "modified by an inplace operation" in plain.stderr
    guarded = _run([*GRADGUARD, "run", "--json", "out.json", name], tmp_path)
    assert guarded.returncode == 1
    assert "gradguard: InplaceModificationError" in guarded.stderr
    assert "SigmoidBackward0.result" in guarded.stderr
    # the traceback shown above the report contains only the user's frames
    head = guarded.stderr.split("gradguard: InplaceModificationError")[0]
    assert f'File "{tmp_path / "script.py"}", line 6, in <module>' in head
    assert "site-packages" not in head and "src/gradguard" not in head
    (finding,) = json.loads((tmp_path / "out.json").read_text())["findings"]
    assert finding["kind"] == "inplace_modification"
    assert finding["saved_at"]["op"] == "SigmoidBackward0.result"
    assert finding["saved_at"]["line"] == 4
    assert [(w["op"], w["line"]) for w in finding["modified_at"]] == [("aten.mul_.Tensor", 5)]
    assert finding["versions"] == {"saved": 0, "now": 1}
    for key in ("tensor", "explanation", "suggestion", "format_version"):
        assert finding[key]


def test_usage_without_command(tmp_path):
    result = _run([*GRADGUARD], tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: gradguard")


@pytest.mark.parametrize("flag", ["--fingerprint=bogus"])
def test_bad_option_names_the_argument(tmp_path, flag):
    name = _script(tmp_path, "print(1)\n")
    result = _run([*GRADGUARD, "run", flag, name], tmp_path)
    assert result.returncode == 2
    assert "argument --fingerprint: invalid choice: 'bogus' (choose from 'auto', 'full', 'sample', 'off')" in result.stderr


def test_sentinel_mode_names_saver_and_auto_mode_reruns_to_name_the_writer(tmp_path):
    name = _script(
        tmp_path,
        """
        import torch
        torch.manual_seed(0)
        x = torch.randn(3, requires_grad=True)
        y = x.exp()
        y += 1
        y.sum().backward()
        """,
    )
    sentinel = _run([*GRADGUARD, "run", "--mode", "sentinel", "--json", "s.json", name], tmp_path)
    assert sentinel.returncode == 1
    (finding,) = json.loads((tmp_path / "s.json").read_text())["findings"]
    assert finding["saved_at"]["op"] == "ExpBackward0.result" and finding["saved_at"]["line"] == 5
    assert finding["modified_at"] == []
    assert any("write tracking was off" in note for note in finding["notes"])

    auto = _run([*GRADGUARD, "run", "--json", "a.json", name], tmp_path)
    assert auto.returncode == 1
    (finding,) = json.loads((tmp_path / "a.json").read_text())["findings"]
    assert [(w["op"], w["line"]) for w in finding["modified_at"]] == [("aten.add_.Tensor", 6)]
    assert finding["notes"] == [
        "the write was found by re-running the script with `gradguard run --mode forensic` "
        "(healthy runs pay only for the cheap sentinel)"
    ]
    assert "gradguard run --mode forensic" in " ".join(auto.stderr.split())  # wrapped at 80 columns
