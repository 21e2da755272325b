"""The in-place memory advisor: proposals are verified by a real rewritten run; each safety rule on its own."""

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

import gradguard
from gradguard.advisor import pipeline
from gradguard.advisor.api import simulate_peak
from gradguard.advisor.api import FunctionStep, _identical, _run
from gradguard.advisor.trace import StepMode


def _line_of(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    for offset, text in enumerate(lines):
        if marker in text:
            return first + offset
    raise AssertionError(f"marker {marker!r} not found")


def _advise(step, **kw):
    kw.setdefault("repeats", 0)
    return gradguard.advise(step, **kw)


def _rejected_at(report, line):
    return [r for r in report.rejected if r.location is not None and r.location.line == line]


def _proposed_at(report, line):
    everything = report.proposals + report.safe_without_peak_gain
    return [p for p in everything if p.location is not None and p.location.line == line]


@pytest.fixture
def weights():
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(8, 16)
    return w, x


def test_proposes_relu_on_dead_input_with_verified_peak_saving(weights):
    w, x = weights

    def step():
        w.grad = None
        h = x @ w
        a = torch.relu(h)  # PROPOSE
        b = a @ w  # h is still a live local here: in-place relu would free it for the rest of the step
        b.sum().backward()

    report = _advise(step)
    line = _line_of(step, "# PROPOSE")
    hits = [p for p in report.proposals if p.location.line == line]
    assert len(hits) == 1
    p = hits[0]
    assert p.op == "aten::relu" and p.inplace_op == "aten::relu_"
    assert p.verified and p.gradients_identical
    assert p.claimed_peak_saving == 8 * 16 * 4  # the [8, 16] float32 input of relu
    assert p.measured_peak_saving == p.claimed_peak_saving
    assert report.gradients_identical is True
    assert report.measured_total_saving == report.claimed_total_saving == p.claimed_peak_saving
    assert report.rewritten_peak == report.baseline_peak - p.claimed_peak_saving
    assert not report.unverified


def test_rule_saved_for_backward_by_another_op(weights):
    w, x = weights

    def step():
        w.grad = None
        s = torch.sigmoid(x @ w)  # sigmoid saves its output s
        t = s + 1.0  # SAVED
        (t * t).sum().backward()

    report = _advise(step)
    rej = _rejected_at(report, _line_of(step, "# SAVED"))
    assert len(rej) == 1
    assert rej[0].codes == ["saved_for_backward"]
    assert "aten::sigmoid" in rej[0].reasons[0][1]
    assert not _proposed_at(report, _line_of(step, "# SAVED"))


def test_rule_saved_for_backward_by_the_op_itself(weights):
    w, x = weights

    def step():
        w.grad = None
        h = x @ w
        y = torch.abs(h)  # OWN
        y.sum().backward()

    report = _advise(step)
    rej = _rejected_at(report, _line_of(step, "# OWN"))
    assert len(rej) == 1 and rej[0].codes == ["saved_for_backward"]
    assert "this op saves it" in rej[0].reasons[0][1]


def test_rule_leaf_requires_grad():
    torch.manual_seed(0)
    x = torch.randn(4, 4)

    def step():
        leaf = torch.randn(4, 4).requires_grad_()
        y = leaf.mul(x)  # LEAF
        y.sum().backward()

    report = _advise(step)
    rej = [r for r in _rejected_at(report, _line_of(step, "# LEAF")) if r.operand == "self"]
    assert len(rej) == 1 and rej[0].codes[0] == "leaf_requires_grad"
    # The rule matters: the in-place form raises in plain PyTorch.
    leaf = torch.randn(4, 4).requires_grad_()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        leaf.mul_(x)


def test_rule_aliased_by_live_view(weights):
    w, x = weights
    kept = []

    def step():
        kept.clear()
        w.grad = None
        h = x @ w
        kept.append(h[0])  # a view of h outlives the step
        a = torch.relu(h)  # VIEW
        (a @ w).sum().backward()

    report = _advise(step)
    rej = _rejected_at(report, _line_of(step, "# VIEW"))
    assert len(rej) == 1 and rej[0].codes == ["aliased_by_live_view"]
    assert not _proposed_at(report, _line_of(step, "# VIEW"))


def test_rule_outlives_step_referenced_after(weights):
    w, x = weights
    kept = []

    def step():
        kept.clear()
        w.grad = None
        h = x @ w
        kept.append(h)
        a = torch.relu(h)  # KEPT
        (a @ w).sum().backward()

    report = _advise(step)
    rej = _rejected_at(report, _line_of(step, "# KEPT"))
    assert len(rej) == 1 and rej[0].codes == ["outlives_step"]
    assert "still referenced after the step" in rej[0].reasons[0][1]


def test_rule_outlives_step_input_of_the_step(weights):
    w, x = weights

    def step():
        w.grad = None
        xr = torch.tanh(x)  # INPUT: x is the caller's batch
        (xr @ w).sum().backward()

    report = _advise(step)
    rej = _rejected_at(report, _line_of(step, "# INPUT"))
    assert len(rej) == 1 and rej[0].codes[0] == "outlives_step"
    assert "existed before the step" in rej[0].reasons[0][1]


def test_rule_used_later(weights):
    w, x = weights

    def step():
        w.grad = None
        h = x @ w
        a = torch.relu(h)  # LATER
        b = h * 3.0  # reads h again
        (a @ w + b).sum().backward()

    report = _advise(step)
    rej = _rejected_at(report, _line_of(step, "# LATER"))
    assert len(rej) == 1 and rej[0].codes == ["used_later"]
    assert "aten::mul.Tensor" in rej[0].reasons[0][1]
    assert str(_line_of(step, "# reads h again")) in rej[0].reasons[0][1]


def test_rule_needed_by_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    seen = []

    def step():
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        g = model.weight.grad.abs()  # OPTIM: the optimizer reads .grad afterwards
        seen.append(float(g.max()))
        opt.step()

    report = _advise(step)
    rej = _rejected_at(report, _line_of(step, "# OPTIM"))
    assert len(rej) == 1
    assert "needed_by_optimizer" in rej[0].codes
    assert rej[0].codes[0] == "needed_by_optimizer"


def test_rule_autograd_view_multi_output(weights):
    w, x = weights

    def step():
        w.grad = None
        h = x @ w
        first, second = h.chunk(2, 0)
        y = torch.relu(first)  # UNBIND
        (y.sum() + second.sum()).backward()

    report = _advise(step)
    rej = _rejected_at(report, _line_of(step, "# UNBIND"))
    assert len(rej) == 1 and rej[0].codes[0] == "autograd_view"
    assert "MULTI_OUTPUT_NODE" in rej[0].reasons[0][1]
    # The rule matters: in place on such a view raises in plain PyTorch.
    first, _ = (x @ w).chunk(2, 0)
    with pytest.raises(RuntimeError, match="multiple views"):
        first.relu_()


def test_commutative_add_overwrites_the_dead_operand(weights):
    w, x = weights

    def step():
        w.grad = None
        g = torch.sigmoid(x @ w)  # saved by sigmoid: may not be overwritten
        h = x @ w.t()
        y = g + h  # OTHER
        (y @ w).sum().backward()

    report = _advise(step)
    hits = _proposed_at(report, _line_of(step, "# OTHER"))
    assert len(hits) == 1 and hits[0].operand == "other"
    assert hits[0].verified


def test_unsafe_inplace_that_raises_in_pytorch(weights):
    w, x = weights

    def step():
        w.grad = None
        s = torch.sigmoid(x @ w)
        s.mul_(2.0)  # RAISES
        s.sum().backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        step()
    report = _advise(step)
    assert len(report.unsafe_inplace) == 1
    u = report.unsafe_inplace[0]
    assert u.kind == "raises" and u.op == "aten::mul_.Tensor"
    assert u.location.line == _line_of(step, "# RAISES")
    assert u.saved_by == "aten::sigmoid"


def test_unsafe_inplace_that_corrupts_silently(weights):
    w, x = weights

    def step():
        w.grad = None
        s = torch.sigmoid(x @ w)
        s.data.mul_(2.0)  # SILENT
        s.sum().backward()

    step()  # plain PyTorch does not notice
    report = _advise(step)
    assert [u.kind for u in report.unsafe_inplace] == ["silent"]
    assert report.unsafe_inplace[0].location.line == _line_of(step, "# SILENT")


def test_verification_catches_an_unsafe_rewrite(weights):
    """The rewrite run really detects a wrong proposal: forcing the saved operand in place changes gradients."""
    w, x = weights

    def step():
        w.grad = None
        s = torch.sigmoid(x @ w)
        t = s * 3.0
        (t * t).sum().backward()

    fs = FunctionStep(step, (), {})
    base = _run(fs, StepMode(record=True))
    mul = [op for op in base.mode.ops if op.name == "aten::mul.Tensor" and op.phase == "forward"][0]
    forced = _run(fs, StepMode(record=False, plan={mul.key: 0}))
    assert mul.key in forced.mode.applied
    assert not _identical(base, forced)
    again = _run(fs, StepMode(record=False))
    assert _identical(base, again)


def test_state_is_restored_after_advise():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(5, 8)
    # one real step first, so optimizer state exists and is written in place by every advised run
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt_before = [(s["exp_avg"].clone(), s["exp_avg_sq"].clone(), s["step"].clone())
                  for s in opt.state.values()]

    def step():
        opt.zero_grad()
        h = model(x)
        loss = (h * 2.0).pow(2).mean()
        loss.backward()
        opt.step()

    _advise(step)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    for (a, b, c), s in zip(opt_before, opt.state.values()):
        assert torch.equal(a, s["exp_avg"]) and torch.equal(b, s["exp_avg_sq"]) and torch.equal(c, s["step"])


def test_invalid_arguments_name_the_argument():
    with pytest.raises(gradguard.InvalidArgument, match="'fn'"):
        gradguard.advise(3)
    with pytest.raises(gradguard.InvalidArgument, match="'repeats'"):
        gradguard.advise(lambda: None, repeats=-1)
    with pytest.raises(gradguard.InvalidArgument, match="'kwargs'"):
        gradguard.advise(lambda: None, kwargs=[1])
    with pytest.raises(gradguard.InvalidArgument, match="'per_proposal'"):
        gradguard.advise(lambda: None, per_proposal="yes")


def test_simulate_peak_shared_storage_lifetimes():
    # a(0, 100) alive, b(1, 100) allocated, a freed, c(2, 50), b freed, c freed
    events = [("a", 0, 100, 0), ("a", 1, 100, 1), ("f", 0, 1), ("a", 2, 50, 2), ("f", 1, 2), ("f", 2, 3)]
    assert simulate_peak(events, []) == 200
    # b reuses a's memory: peak is a (100) + c (50)
    assert simulate_peak(events, [(0, 1)]) == 150
    # a chain a <- b <- c: one storage
    assert simulate_peak(events, [(0, 1), (1, 2)]) == 100


def test_report_renders_and_serialises(weights):
    w, x = weights

    def step():
        w.grad = None
        h = x @ w
        a = torch.relu(h)
        (a @ w).sum().backward()

    report = _advise(step)
    text = report.render()
    assert "aten::relu -> aten::relu_" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["proposals"][0]["verified"] is True
    assert data["proposals"][0]["measured_peak_saving"] == data["proposals"][0]["claimed_peak_saving"]


def test_cli_advise_on_a_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "w = torch.randn(32, 32, requires_grad=True)\n"
        "opt = torch.optim.SGD([w], lr=0.1)\n"
        "x = torch.randn(16, 32)\n"
        "def train_step():\n"
        "    opt.zero_grad()\n"
        "    h = x @ w\n"
        "    a = torch.relu(h)\n"
        "    (a @ w).sum().backward()\n"
        "    opt.step()\n"
        "for i in range(5):\n"
        "    train_step()\n"
    )
    out_json = tmp_path / "report.json"
    env = dict(os.environ, HOME=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "gradguard", "advise", "--repeats", "0", "--json", str(out_json), str(script)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "aten::relu -> aten::relu_" in proc.stdout
    data = json.loads(out_json.read_text())
    assert (data["tool"], data["report"]) == ("gradguard", "advise")
    assert [p["location"]["line"] for p in data["findings"]] == [9]
    assert data["findings"][0]["verified"] is True


def test_cli_advise_missing_script(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gradguard", "advise", str(tmp_path / "nope.py")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "can't open file" in proc.stderr


class _Cand(pipeline.Candidate):
    def __init__(self, site, operand, dead):
        self.site, self.key, self.operand, self.dead, self.reasons = site, (site,), operand, dead, []


def test_pipeline_judge_keeps_one_operand_per_call():
    tests = [("used_later", lambda c: None if c.dead else "read later")]
    cands = [_Cand(1, 0, False), _Cand(1, 1, True), _Cand(2, 0, True), _Cand(2, 1, True), _Cand(3, 0, False)]
    torch_like = pipeline.judge(list(cands), tests, keep_rejected=False)
    assert [(c.site, c.operand, c.safe) for c in torch_like] == [(1, 1, True), (2, 0, True), (3, 0, False)]
    paddle_like = pipeline.judge(list(cands), tests, keep_rejected=True)
    assert [(c.site, c.operand) for c in paddle_like] == [(1, 0), (1, 1), (2, 0), (3, 0)]


@pytest.mark.parametrize("explain", [False, True])
def test_pipeline_verify_together_then_alone_then_the_rest_together(explain):
    a, b, c = _Cand(1, 0, True), _Cand(2, 0, True), _Cand(3, 0, True)
    runs = []

    def check(kind, group):  # b fails alone; a and c fail together
        runs.append((kind, [x.site for x in group]))
        sites = {x.site for x in group}
        return "differs" if 2 in sites or {1, 3} <= sites else None

    failed = pipeline.verify([a, b, c], check, ("poison", "rewrite"), explain_together=explain)
    together = "failed when applied together with the others" + (": differs" if explain else "")
    assert failed == {id(b): "differs", id(a): together, id(c): together}
    assert runs == [("poison", [1, 2, 3]), ("poison", [1]), ("poison", [2]), ("poison", [3]), ("poison", [1, 3])]
