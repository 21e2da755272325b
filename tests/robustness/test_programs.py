"""Each program runs twice, as `python prog.py` and as `gradguard run prog.py`: same exit code, same stdout
(programs print digests of their gradients). The classes of issue 11 that broke real scripts."""

import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
PROGRAMS = sorted(p.name for p in (HERE / "programs").glob("*.py"))


def _run(*command):
    return subprocess.run([sys.executable, *command], cwd=HERE / "programs", capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("program", PROGRAMS)
def test_gradguard_run_behaves_like_python(program):
    plain = _run(program)
    assert plain.returncode == 0, plain.stderr
    guarded = _run("-m", "gradguard", "run", program)
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout), guarded.stderr
    assert "Traceback" not in guarded.stderr


def test_the_programs_cover_every_class():
    assert PROGRAMS == ["broadcast_operand.py", "dataloader_workers.py", "deep_graph.py", "match_torch_message.py",
                        "pickle_main.py", "user_hooks.py"]
