"""examples/hygiene/: custom Function and tensor-hook writes PyTorch never checks, run as a user would.

Each buggy script prints (under plain python) that its gradient differs from a correct computation, with no
error: the bug is real and silent. Under ``gradguard run`` (the sentinel, with its forensic re-run; forensic
mode where only the write log sees the hazard) it stops at the hazard with the expected finding; each fixed
script is clean and prints exactly what plain python prints.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "hygiene"
EXPECTED_DIR = REPO / "tests" / "expected"
UPDATE = os.environ.get("GRADGUARD_UPDATE_EXPECTED") == "1"
if str(REPO / "tests" / "fast") not in sys.path:
    sys.path.insert(0, str(REPO / "tests" / "fast"))
from _example_runs import comparable as _comparable, panel_message  # noqa: E402  (as the expected-output tests)
EXPECTED = {
    "01_swish_ctx_attribute": ("unchecked_write", "augmented_assignment"),
    "02_inplace_swish_forward": ("undeclared_input_write", "forward_writes_input"),
    "03_clip_grad_backward": ("shared_grad_write", "backward_writes_shared_grad"),
    "04_hook_clamp_residual": ("shared_grad_write", "hook_writes_shared_grad"),
    "05_resblock_inplace_relu": ("module_input_write", "module_writes_caller_input"),
    "06_maml_inplace_inner_step": ("dropped_inner_update", "inner_update_dropped"),
    "07_normalized_weight_data": ("data_write_in_forward", "data_in_forward"),
    "08_eval_batchnorm_then_train_forward": ("silent_write", "eval_running_stats_updated"),
    "09_offload_dedup_transposed_view": ("silent_write", "user_hooks_round_trip"),
}
# the write log (forensic mode) is what sees these hazards; the others are seen by the sentinel
FORENSIC = {"05_resblock_inplace_relu", "07_normalized_weight_data"}


def mode(stem):
    return ["--mode", "forensic"] if stem in FORENSIC else []


def run(args, tmp_path):
    env = {**os.environ, "COLUMNS": "110", "PYTHONHASHSEED": "0"}
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)


def test_every_example_pair_is_listed():
    stems = {p.stem.rsplit("_", 1)[0] for p in EXAMPLES.glob("*.py")}
    assert stems == set(EXPECTED)


@pytest.mark.exhaustive  # `make examples` runs the same examples under gradguard and checks their findings
@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_buggy_is_silent_in_plain_python_and_caught_by_gradguard_run(stem, tmp_path):
    script = f"examples/hygiene/{stem}_buggy.py"
    plain = run([script], tmp_path)
    assert plain.returncode == 0 and plain.stdout.strip().endswith("False"), plain.stdout + plain.stderr
    report = tmp_path / "findings.json"
    guarded = run(["-m", "gradguard", "run", "--json", str(report), *mode(stem), script], tmp_path)
    assert guarded.returncode == 1, guarded.stderr
    (finding,) = json.loads(report.read_text())["findings"]
    assert (finding["kind"], finding["rule"]) == EXPECTED[stem]
    if finding["kind"] == "dropped_inner_update":  # the sentinel sees no write: the gradient's line instead
        assert finding["context"]["gradient_at"]["line"] is not None
    elif finding["rule"] == "user_hooks_round_trip":  # no write: unpack returned another view
        assert finding["context"]["user_hooks"] == "layout" and finding["modified_at"] == []
        assert finding["context"]["writer_unknowable"] is True
    else:
        assert finding["modified_at"][0]["line"] is not None
    # the message is the product: word for word (regenerate with GRADGUARD_UPDATE_EXPECTED=1, review the diff)
    message = panel_message(guarded.stderr)
    expected = EXPECTED_DIR / f"hygiene__{stem}_buggy.txt"
    if UPDATE:
        expected.write_text(message)
    assert expected.exists(), f"{expected} is missing: run with GRADGUARD_UPDATE_EXPECTED=1 and review it"
    assert _comparable(message) == _comparable(expected.read_text())
    flat = " ".join(message.split())
    for key in ("headline", "explanation", "suggestion"):  # one finding, two views
        assert " ".join(finding[key].split()) in flat


@pytest.mark.exhaustive  # `make examples` runs the same examples under gradguard and checks they stay quiet
@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_fixed_is_clean_and_prints_what_plain_python_prints(stem, tmp_path):
    script = str(EXAMPLES / f"{stem}_fixed.py")
    plain = run([script], tmp_path)
    assert plain.returncode == 0 and plain.stdout.strip().endswith("True"), plain.stdout + plain.stderr
    report = tmp_path / "findings.json"
    guarded = run(["-m", "gradguard", "run", "--json", str(report), *mode(stem), script], tmp_path)
    assert (guarded.returncode, guarded.stdout) == (0, plain.stdout), guarded.stderr
    assert json.loads(report.read_text())["findings"] == []
