import os
import pathlib

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

_HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if _HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)
