import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

_HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if _HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)


# test_silent_cpp_extension.py compiles a C++ extension with g++ (_cpp_extension.py: ~40 s alone, minutes on a
# loaded 2-core machine), once per source hash, into a folder under a lock its loaders queue on. Its tests may be
# spread over the xdist workers, and each worker's module fixture then waited there for the whole build: one worker
# built while the other sat idle. When they are selected, one process of the session (xdist's gw0, or pytest itself
# without xdist) starts the build in the background as collection ends, so it overlaps the tests that run before
# them and the fixtures only load the built extension. (The extension of examples/silent/
# cpp_extension_writes_pointer.py is built inside the one test that runs that example: no other worker waits on it.)
_PREBUILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
import _cpp_extension
_cpp_extension.load()
"""
_prebuild = None


def pytest_collection_finish(session):
    global _prebuild
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0" or session.config.option.collectonly:
        return
    extension_tests = _HERE / "test_silent_cpp_extension.py"
    if any(pathlib.Path(str(item.fspath)) == extension_tests for item in session.items):
        # its own session, so that an interrupted test run can stop it with its compiler
        _prebuild = subprocess.Popen([sys.executable, "-c", _PREBUILD, str(_HERE)], cwd=_HERE,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)


def pytest_sessionfinish(session, exitstatus):
    if _prebuild is None or _prebuild.poll() is not None:
        return
    try:  # another worker's test may still wait for it: let it finish unless the run was interrupted
        _prebuild.wait(timeout=0 if exitstatus == pytest.ExitCode.INTERRUPTED else 1800)
    except subprocess.TimeoutExpired:
        os.killpg(_prebuild.pid, signal.SIGTERM)
        _prebuild.wait()


@pytest.fixture(scope="session")
def once_per_session(tmp_path_factory):
    """``once_per_session(key, make)``: the value of ``make()`` (JSON data), made once per test session. Under
    pytest-xdist every worker would make a module's fixture again (worksteal spreads a module's tests over the
    workers): the first worker that asks makes it, the others wait for it and read it from a file in the workers'
    common temporary folder (unique to the session)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent

    def once(key: str, make):
        stored = shared / f"{key}.json"
        with open(shared / f"{key}.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes, also if make() raises
            if not stored.exists():
                partial = stored.with_suffix(".partial")
                partial.write_text(json.dumps(make()))
                partial.replace(stored)
            return json.loads(stored.read_text())

    return once
