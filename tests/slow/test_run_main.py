"""`gradguard run` runs the script as the real ``__main__`` module (what runpy does, ``sys.modules['__main__']``
included): everything that pickles a class or function defined in the script works exactly as under plain
``python``: ``torch.save(model)``, multiprocessing pools (fork and spawn), a spawn ``Process``, a spawn
``DataLoader``, and a DataLoader worker returning a script-defined batch class (which used to hang forever).
Each scenario runs plainly and under gradguard; exit code and stdout must match."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

PYTHON = sys.executable

SCENARIOS = {
    "torch_save_model": """
        import io, torch
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(2, 1)
        if __name__ == "__main__":
            buffer = io.BytesIO()
            torch.save(Net(), buffer)
            buffer.seek(0)
            print(type(torch.load(buffer, weights_only=False)).__name__)
    """,
    "pool_fork_and_spawn": """
        import multiprocessing as mp
        def square(x):
            return x * x
        if __name__ == "__main__":
            for method in ("fork", "spawn"):
                with mp.get_context(method).Pool(2) as pool:
                    print(method, pool.map(square, range(4)))
    """,
    "spawn_process": """
        import multiprocessing as mp
        def work(queue):
            queue.put("from child")
        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            process = ctx.Process(target=work, args=(queue,))
            process.start()
            print(queue.get(timeout=60))
            process.join()
            print("exit", process.exitcode)
    """,
    "spawn_dataloader": """
        import torch
        from torch.utils.data import DataLoader, Dataset
        class Squares(Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                return torch.tensor([float(i * i)])
        if __name__ == "__main__":
            loader = DataLoader(Squares(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
            print([b.flatten().tolist() for b in loader])
    """,
    "dataloader_collate_returns_script_class": """
        import torch
        from torch.utils.data import DataLoader
        class Batch:
            def __init__(self, items):
                self.values = torch.stack(items)
        def collate(items):
            return Batch(items)
        if __name__ == "__main__":
            data = [torch.full((2,), float(i)) for i in range(6)]
            loader = DataLoader(data, batch_size=2, num_workers=2, collate_fn=collate)
            print([type(b).__name__ + str(b.values.sum().item()) for b in loader])
    """,
}


def _run(cmd, cwd):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=240)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_script_is_the_real_main(tmp_path, scenario):
    (tmp_path / "script.py").write_text(textwrap.dedent(SCENARIOS[scenario]))
    plain = _run([PYTHON, "script.py"], tmp_path)
    assert plain.returncode == 0, plain.stderr
    guarded = _run([PYTHON, "-m", "gradguard", "run", "script.py"], tmp_path)
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout), guarded.stderr


def test_module_form_spawn_pool_and_package_main(tmp_path):
    """`gradguard run -m pkg.mod args` is `python -m pkg.mod args`: __spec__, argv, relative imports, and spawn
    children re-import the module by name; `-m pkg` runs the package's __main__."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("def cube(x):\n    return x ** 3\n")
    (package / "train.py").write_text(textwrap.dedent("""
        import multiprocessing as mp
        import sys
        from .helper import cube
        if __name__ == "__main__":
            print(__spec__.name, __package__, sys.argv[1:])
            with mp.get_context("spawn").Pool(1) as pool:
                print(pool.map(cube, [1, 2]))
    """))
    (package / "__main__.py").write_text("import sys\nprint('package main', sys.argv[1:])\n")
    for module in (["pkg.train", "--lr", "3"], ["pkg", "x"]):
        plain = _run([PYTHON, "-m", *module], tmp_path)
        assert plain.returncode == 0, plain.stderr
        guarded = _run([PYTHON, "-m", "gradguard", "run", "-m", *module], tmp_path)
        assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout), guarded.stderr
