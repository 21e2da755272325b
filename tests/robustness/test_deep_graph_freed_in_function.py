"""A 100k-op graph built and freed inside a function, run as `python prog.py`, as `gradguard run prog.py` and
as a test under `pytest --gradguard`: same exit code and output. Each runs in a subprocess, so a segfault (the
unpack hook once made a Python object for every autograd node, and freeing the chain recursed through them)
fails this test instead of killing pytest."""

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import torch


    def grad_of_deep_chain(n):
        h = torch.full((4,), 0.5, requires_grad=True)
        x = h
        for _ in range(n):
            x = torch.tanh(x)  # every op saves its result: 100k nodes the backward unpacks
        x.sum().backward()
        return h.grad


    def test_deep_chain():
        assert grad_of_deep_chain(100_000).shape == (4,)


    if __name__ == "__main__":
        print("grad", grad_of_deep_chain(100_000).double().sum().item())
        print("freed")
""")


def _run(tmp_path, *command):
    (tmp_path / "deep_chain.py").write_text(PROGRAM)
    return subprocess.run([sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=600)


def test_gradguard_run_frees_a_100k_op_graph_inside_a_function_like_python(tmp_path):
    plain = _run(tmp_path, "deep_chain.py")
    assert plain.returncode == 0 and "freed" in plain.stdout, plain.stderr
    guarded = _run(tmp_path, "-m", "gradguard", "run", "deep_chain.py")
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout), guarded.stderr[-2000:]


def test_pytest_gradguard_frees_a_100k_op_graph_inside_a_test(tmp_path):
    result = _run(tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--gradguard", "deep_chain.py")
    assert result.returncode == 0 and "1 passed" in result.stdout, (result.returncode, result.stdout[-2000:],
                                                                   result.stderr[-2000:])
