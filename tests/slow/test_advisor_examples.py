"""The advisor on the bundled examples: every proposal verified (bit-identical gradients, measured peak drop
equal to the claim), nothing unverified, no unsafe in-place op in these out-of-place models."""

import importlib.util
import json
import os
import pathlib
import subprocess


EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "advisor"
ROOT = EXAMPLES.parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"advisor_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(report, expected_lines):
    assert report.proposals, report.render()
    for p in report.proposals:
        assert p.verified and p.gradients_identical
        assert p.claimed_peak_saving > 0
        assert p.measured_peak_saving == p.claimed_peak_saving
    assert not report.unverified, report.render()
    assert not report.unsafe_inplace
    assert report.gradients_identical is True
    assert report.measured_total_saving == report.claimed_total_saving > 0
    assert report.rewritten_peak == report.baseline_peak - report.measured_total_saving
    lines = {p.location.code for p in report.proposals + report.safe_without_peak_gain}
    for code in expected_lines:
        assert code in lines, (code, lines)
    # Independent cross-check with the CPU allocator's own reports: the peak really drops.
    assert report.allocator_peaks is not None
    base_alloc, new_alloc = report.allocator_peaks
    assert base_alloc >= report.baseline_peak and new_alloc < base_alloc
    # The rules kept everything the backward pass needs out-of-place: each rejection has a reason.
    assert all(r.reasons for r in report.rejected)


def test_cnn_example():
    report = _load("cnn_out_of_place").main(repeats=1)
    _check(report, ["a1 = F.relu(n1)", "s = n2 + x  # residual", "act = F.relu(stem)"])
    assert report.baseline_seconds is not None and report.rewritten_seconds is not None


def test_transformer_example():
    report = _load("transformer_block_out_of_place").main(repeats=1)
    _check(report, ["scaled = scores / math.sqrt(d // self.heads)",
                    'masked = scaled.masked_fill(mask, float("-inf"))'])
    # the residual stream x is read by LayerNorm and saved: never proposed
    assert not [p for p in report.proposals if p.location.code == "h = x + attn" and p.operand == "self"]


PADDLE = ROOT / ".venv-paddle" / "bin" / "python"


def test_paddle_example(tmp_path):
    # A required backend: a missing venv is a failure, not a skip (`make test` creates it first).
    assert PADDLE.exists(), "the Paddle venv is missing: run `make install-paddle`"
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(EXAMPLES)!r})\n"
        "import paddle_inplace_memory as m\n"
        "r, u = m.main(repeats=2)\n"
        "print('@@' + json.dumps([r.to_dict(), u.to_dict()]))\n"
    )
    env = dict(os.environ, HOME=str(tmp_path))
    proc = subprocess.run([str(PADDLE), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data, unsafe = json.loads(proc.stdout.split("@@", 1)[1])
    assert len(data["proposals"]) == 3 and not data["unverified"]
    for p in data["proposals"]:
        assert p["gradients_identical"] and p["measured_peak_saving"] > 0
    assert data["gradients_identical"] is True
    assert data["measured_total_saving"] > 0
    assert data["unsafe_inplace"] == []
    # the second step writes sigmoid's saved output in place: listed, with both lines, and nothing proposed
    assert [u["kind"] for u in unsafe["unsafe_inplace"]] == ["raises"] and unsafe["proposals"] == []
