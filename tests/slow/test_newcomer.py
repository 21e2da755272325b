"""What a newcomer does after cloning: build the wheel, install it in a clean venv (with torch), run
``gradguard --version`` and the README's quick start, and check the JSON it writes against the schema the
wheel ships. Nothing from the repository's source tree is on the path of the installed tool."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import jsonschema
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the pinned development torch (requirements-dev.txt); pip finds it locally when cached


def _clean_env() -> dict[str, str]:
    """The environment without anything that points at the repository or the development venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", PYTHONNOUSERSITE="1")
    return env


def _run(argv, cwd, timeout=600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, env=_clean_env(),
                          timeout=timeout, **kwargs)


def _quickstart() -> str:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- quickstart -->\n```python\n(.*?)```", readme, re.S)
    assert match, "README.md lost its quick start (a python block after <!-- quickstart -->)"
    return match.group(1)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A clean venv with the freshly built wheel (and torch) installed; returns its bin directory."""
    work = tmp_path_factory.mktemp("newcomer")
    source = work / "source"  # a copy: building must not leave build/ or *.egg-info in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", work / "dist", source],
                 cwd=work)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (work / "dist").glob("gradguard-*.whl")

    venv.create(work / "venv", with_pip=True, clear=True)
    bin_dir = work / "venv" / "bin"
    done = _run([bin_dir / "python", "-m", "pip", "install", "-q", str(wheel), TORCH], cwd=work, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return bin_dir


def test_version_and_package_files(installed):
    version = _run([installed / "gradguard", "--version"], cwd=installed)
    assert version.returncode == 0, version.stderr
    pyproject_version = re.search(r'__version__ = "([^"]+)"', (ROOT / "src/gradguard/_version.py").read_text())[1]
    assert version.stdout.strip() == f"gradguard {pyproject_version}"
    probe = _run([installed / "python", "-c", (
        "import importlib.metadata as m, pathlib, gradguard\n"
        "d = m.distribution('gradguard')\n"
        "print(d.version, d.metadata['License-Expression'], gradguard.__file__)\n"
        "print(sorted(str(f) for f in d.files if f.name in ('py.typed', 'LICENSE') or f.name.endswith('.schema.json')))")],
        cwd=installed)
    assert probe.returncode == 0, probe.stderr
    first, files = probe.stdout.splitlines()
    dist_version, licence, module = first.split()
    assert (dist_version, licence) == (pyproject_version, "Apache-2.0")
    assert str(ROOT / "src") not in module and "site-packages" in module  # the wheel, not the checkout
    assert files == str(sorted([
        "gradguard-%s.dist-info/licenses/LICENSE" % pyproject_version, "gradguard/py.typed",
        "gradguard/schemas/advise.schema.json", "gradguard/schemas/check_op.schema.json",
        "gradguard/schemas/fix.schema.json", "gradguard/schemas/guard.schema.json"]))


def test_readme_quick_start_and_json_schema(installed, tmp_path):
    (tmp_path / "train.py").write_text(_quickstart())
    plain = _run([installed / "python", "train.py"], cwd=tmp_path)
    assert plain.returncode == 1 and "modified by an inplace operation" in plain.stderr

    guarded = _run([installed / "gradguard", "run", "--json", "findings.json", "train.py"], cwd=tmp_path)
    assert guarded.returncode == 1, guarded.stderr
    assert "gradguard: InplaceModificationError" in guarded.stderr
    assert "gate *= 2" in guarded.stderr and "fix" in guarded.stderr

    schema_text = _run([installed / "python", "-c",
                        "from gradguard.schemas import schema_path; print(schema_path('guard').read_text())"],
                       cwd=tmp_path)
    assert schema_text.returncode == 0, schema_text.stderr
    schema = json.loads(schema_text.stdout)
    document = json.loads((tmp_path / "findings.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(document)
    (finding,) = document["findings"]
    assert (finding["kind"], finding["tensor"]["name"], finding["saved_at"]["line"]) == (
        "inplace_modification", "gate", 4)
    assert [(w["op"], w["line"]) for w in finding["modified_at"]] == [("aten.mul_.Tensor", 5)]
