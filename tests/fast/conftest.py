import os

import pytest

# Triton kernels run on CPU only under the interpreter, and @triton.jit reads this at decoration time,
# so it must be set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def _example_runs_shared_by_the_xdist_workers(tmp_path_factory):
    """Under pytest-xdist the bundled examples run once per session, not once per worker (tests/fast/
    _example_runs.py): the workers' temporary folders share a parent folder, unique to this session."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import _example_runs

        _example_runs.SHARED_DIR = tmp_path_factory.getbasetemp().parent
    yield
