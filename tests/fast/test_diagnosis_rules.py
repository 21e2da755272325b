"""The diagnosis rules on hand-built findings (no framework): which rule fires, and that its fix is
written against the user's own lines. The source-reading helpers are tested on small files."""

from __future__ import annotations

import linecache
import textwrap

import pytest

from gradguard.core.diagnosis import diagnose
from gradguard.core.facts import Facts
from gradguard.core.findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from gradguard.core.fixes import assigned_names, carried_state, mask_assignment, out_of_place, step_receivers


@pytest.fixture
def source(tmp_path):
    """Write a script; returns (path, line_of) where line_of(code) is the 1-based line starting with code."""

    def make(text: str):
        path = tmp_path / "train.py"
        path.write_text(textwrap.dedent(text))
        linecache.checkcache(str(path))
        lines = path.read_text().splitlines()

        def line_of(code: str) -> int:
            return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(code))

        def at(code: str, function: str = "<module>") -> SourceLocation:
            number = line_of(code)
            return SourceLocation(str(path), number, function, lines[number - 1].strip())

        return path, at

    return make


def _finding(saved_at, writes, tensor=None, **facts) -> Finding:
    tensor = tensor or TensorInfo(shape=(2, 2), dtype="float32")
    return diagnose(Finding(kind="inplace_modification", tensor=tensor, saved_at=saved_at, modified_at=writes,
                            versions={"saved": 0, "now": 1}, facts=Facts(**facts)))


# -- source helpers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("code, expected", [
    ("h *= 0.5", "h = h * 0.5"),
    ("out += identity", "out = out + identity"),
    ("weights /= weights.sum(dim=1, keepdim=True)", "weights = weights / weights.sum(dim=1, keepdim=True)"),
    ("q *= 8 ** -0.5", "q = q * 8 ** -0.5"),  # ** binds tighter than *: the rewrite adds no parentheses
    ("a.mul_(2)", "a = a.mul(2)"),
    ("torch.relu_(x)", "x = torch.relu(x)"),
    ("x = y + 1", None),
])
def test_out_of_place(code, expected):
    assert out_of_place(code) == expected


def test_assigned_names_are_what_the_statement_binds():
    assert assigned_names("out, h = rnn(x, h)") == ["out", "h"]
    assert assigned_names("self.u = v") == ["self.u"]
    assert assigned_names("w.grad = g") == ["w.grad"]
    assert assigned_names("x[0] = 1") == []


def test_mask_assignment_rewrites_boolean_masks_only():
    assert mask_assignment("probs[probs < 0.1] = 0.0") == "probs = probs.masked_fill(probs < 0.1, 0.0)"
    assert mask_assignment("x[~keep] = 0") == "x = x.masked_fill(~keep, 0)"
    assert mask_assignment("features[:, 0] = 0") is None


def test_carried_state_finds_the_loop_carried_variable(source):
    _path, at = source("""
        h_cur = h0
        for i in range(5):
            out, h_next = rnn(x[i], h_cur)
            loss = (out - y[i]).pow(2).sum()
            loss.backward(retain_graph=True)
            opt.step()
            h_cur = h_next
    """)
    [state] = carried_state(at("loss.backward"))
    assert state.name == "h_cur"
    assert state.source == "h_next"
    assert state.assignment.line == at("h_cur = h_next").line
    assert state.detach_fix() == f"`h_cur = h_next.detach()` (line {at('h_cur = h_next').line})"


def test_carried_state_bound_by_a_call_and_tuple_fix(source):
    _path, at = source("""
        state = None
        for chunk in chunks:
            out, state = lstm(chunk, state)
            loss = out.sum()
            loss.backward()
    """)
    [state] = carried_state(at("loss.backward"))
    line = at("out, state = lstm").line
    assert state.detach_fix(is_tuple=True) == f"`state = tuple(s.detach() for s in state)` right after line {line}"


def test_a_state_carried_by_its_own_assignment_is_detached_where_it_reads_the_previous_value(source):
    """``h = cell(x, h)``: detached after the assignment, this step's h would reach the loss below as a constant."""
    from gradguard.core.edits import apply_intent

    path, at = source("""
        for x in xs:
            h = cell(x, h)
            avg = 0.9 * avg + 0.1 * h.mean(0)
            loss = head(h - avg).pow(2).mean()
            loss.backward()
    """)
    states = {s.name: s for s in carried_state(at("loss.backward"))}
    line = at("h = cell").line
    assert states["h"].detach_fix() == f"`h = cell(x, h.detach())` (line {line})"
    assert states["avg"].detach_fix() == f"`avg = 0.9 * avg.detach() + 0.1 * h.mean(0)` (line {line + 1})"
    intent = states["h"].detach_intent()
    assert intent.action == "detach_expression" and intent.line == line
    assert "    h = cell(x, h.detach())\n" in apply_intent(open(path).read(), intent)


def test_no_carried_state_when_every_value_is_fresh(source):
    _path, at = source("""
        for step in range(3):
            fake = G(z)
            loss = D(fake).mean()
            loss.backward()
    """)
    assert carried_state(at("loss.backward")) == []


def test_step_receivers_tells_two_models_from_one(source):
    _path, at = source("""
        def train():
            opt_d.step()
            opt_g.step()
            opt_d.step()
    """)
    assert step_receivers(at("opt_d.step()", "train")) == ["opt_d", "opt_g"]


# -- rules ---------------------------------------------------------------------------------------------


def test_optimizer_step_in_an_earlier_iteration_is_retained_graph_with_detach_fix(source):
    _path, at = source("""
        h_cur = h0
        for i in range(5):
            out, h_next = rnn(x[i], h_cur)
            loss = (out - y[i]).pow(2).sum()
            loss.backward(retain_graph=True)
            opt.step()
            h_cur = h_next
    """)
    step = WriteRecord(op="aten.add_.Tensor", location=at("opt.step()"), via="SGD.step()", category="optimizer",
                       version_before=2, version_after=3)
    f = _finding(SaveSite("AddmmBackward0", "mat2", at("out, h_next = rnn")), [step],
                 TensorInfo((1, 1), "float32", name="rnn.weight_hh_l0", role="parameter"),
                 backward_passes_since_save=1, retain_graph=True, backward_at=at("loss.backward").to_dict())
    assert f.rule == "retained_graph_across_steps"
    assert "parameter rnn.weight_hh_l0" in f.explanation
    assert "`h_cur = h_next.detach()`" in f.suggestion
    assert "drop retain_graph=True from `loss.backward(retain_graph=True)`" in f.suggestion


def test_a_helper_that_steps_called_once_per_loss_is_a_step_between_backwards_not_an_earlier_iteration(source):
    """zero_grad, backward and step in `update`, called for one loss and then for the next, in one pass over the
    loop's body: the step and the failing backward both follow the earlier backward inside `update`, as in a loop
    that keeps a graph alive, but here the second call of `update` is the later loss's, not the next iteration's."""
    _path, at = source("""
        def update(opt, loss):
            opt.zero_grad()
            loss.backward(retain_graph=True)
            opt.step()
        for _ in range(2):
            score = disc(gen(z))
            update(opt_d, score.pow(2).mean())
            update(opt_g, score.mean())
    """)
    step = WriteRecord(op="aten.add_.Tensor", location=at("opt.step()", "update"), via="SGD.step()",
                       category="optimizer", version_before=1, version_after=2)
    f = _finding(SaveSite("AddmmBackward0", "mat2", at("score = disc")), [step],
                 TensorInfo((4, 1), "float32", name="disc.2.weight", role="parameter"), backward_passes_since_save=1,
                 retain_graph=True, backward_at=at("loss.backward", "update").to_dict())
    assert f.rule == "optimizer_step_between_backwards"
    assert "of an earlier iteration" not in f.explanation
    assert "Make the loss from a forward that runs after the step" in f.suggestion


def test_two_optimizers_step_between_backwards_is_the_gan_order(source):
    _path, at = source("""
        fake = G(z)
        d_loss = D(fake).mean()
        g_loss = -D(fake).mean()
        d_loss.backward(retain_graph=True)
        opt_d.step()
        g_loss.backward()
        opt_g.step()
    """)
    step = WriteRecord(op="aten.add_.Tensor", location=at("opt_d.step()"), via="Adam.step()", category="optimizer")
    f = _finding(SaveSite("AddmmBackward0", "mat2", at("g_loss = -D(fake)")), [step],
                 TensorInfo((1, 1), "float32", name="D.weight", role="parameter"),
                 backward_passes_since_save=1, retain_graph=None, backward_at=at("g_loss.backward").to_dict())
    assert f.rule == "optimizer_step_between_backwards"
    assert "GAN ordering bug" in f.explanation
    assert [(x.action, x.line, x.detail) for x in f.fixes] == [
        ("insert_after", at("opt_d.step()").line, {"code": "g_loss = -D(fake).mean()"}),
        ("detach_argument", at("g_loss = -D(fake)").line, {"call": "D"})]
    assert "re-run `g_loss = -D(fake).mean()` after `opt_d.step()`" in f.suggestion
    assert "e.g. `D(fake.detach())`" in f.suggestion
    assert "an earlier backward ran and Adam.step()" in f.explanation


def test_one_optimizer_step_between_two_losses_suggests_one_backward(source):
    _path, at = source("""
        feats = trunk(x)
        loss_a.backward(retain_graph=True)
        opt.step()
        loss_b.backward()
    """)
    step = WriteRecord(op="aten.add_.Tensor", location=at("opt.step()"), via="Adam.step()", category="optimizer")
    f = _finding(SaveSite("MmBackward0", "mat2", at("feats = trunk(x)")), [step], backward_passes_since_save=1,
                 backward_at=at("loss_b.backward").to_dict())
    assert f.rule == "optimizer_step_between_backwards"
    assert "GAN" not in f.explanation
    assert "move `opt.step()`" in f.suggestion and "after `loss_b.backward()`" in f.suggestion


def test_a_step_after_its_own_backward_in_a_loop_asks_for_a_fresh_forward_not_a_move(source):
    path, at = source("""
        actions = [actor(o) for actor, o in zip(actors, obs)]
        for i in range(3):
            loss = -critics[i](torch.cat(actions, dim=1)).mean()
            loss.backward(retain_graph=True)
            opts[i].step()
    """)
    step = WriteRecord(op="aten.add_.Tensor", location=at("opts[i].step()"), via="SGD.step()", category="optimizer")
    again = {"file": str(path), "line": at("loss = -critics").line, "code": at("actions =").code, "name": "actions",
             "made_line": at("actions =").line}
    f = _finding(SaveSite("MmBackward0", "mat2", at("actions =")), [step], backward_passes_since_save=1,
                 backward_at=at("loss.backward").to_dict(), recompute_in_loop=again,
                 loss_made_early={"file": str(path), "line": 4, "code": at("loss = -critics").code, "name": "loss",
                                  "function": "<module>", "after_line": 4, "backward_block": None})
    assert f.rule == "optimizer_step_between_backwards"
    assert f.suggestion == (
        "Recompute `actions` in the loop, before line 4 (it is made once, at line 2): this backward then goes "
        "through a graph made with the weights `opts[i].step()` (line 6) wrote. (The step already follows its own "
        "backward here, so moving it cannot help.) Or sum the losses and call backward once, before the first step.")
    assert [(i.action, i.line, i.detail.get("code")) for i in f.fixes] == [
        ("insert_before", 4, "actions = [actor(o) for actor, o in zip(actors, obs)]")]


def test_step_before_the_first_backward(source):
    _path, at = source("""
        out = model(x)
        opt.step()
        out.sum().backward()
    """)
    step = WriteRecord(op="aten.add_.Tensor", location=at("opt.step()"), via="SGD.step()", category="optimizer")
    f = _finding(SaveSite("MmBackward0", "mat2", at("out = model(x)")), [step], backward_passes_since_save=0,
                 backward_at=at("out.sum().backward()").to_dict())
    assert f.rule == "optimizer_step_before_backward"
    assert "call `opt.step()` after `out.sum().backward()`" in f.suggestion


def test_inplace_module_after_output_saving_op():
    where = SourceLocation("net.py", 9, "<module>", "y = net(x)")
    act = WriteRecord(op="aten.relu_", location=where, via="net.2 (ReLU(inplace=True))", category="activation")
    f = _finding(SaveSite("SigmoidBackward0", "result", where), [act])
    assert f.rule == "inplace_activation"
    assert "s * (1 - s)" in f.explanation
    assert f.suggestion.startswith("Construct net.2 with inplace=False: `nn.ReLU(inplace=False)`")


def test_second_inplace_relu_over_the_first():
    where = SourceLocation("net.py", 9, "<module>", "y = net(x)")
    act = WriteRecord(op="aten.relu_", location=where, via="net.2 (ReLU(inplace=True))", category="activation")
    f = _finding(SaveSite("ReluBackward0", "result", where), [act])
    assert f.rule == "consecutive_inplace_activation"
    assert f.suggestion.startswith("Drop the second ReLU (net.2)")


def test_augmented_assignment_gets_its_out_of_place_rewrite():
    save = SourceLocation("m.py", 8, "<module>", "h = torch.tanh(z)")
    aug = WriteRecord(op="aten.mul_.Tensor", location=SourceLocation("m.py", 9, "<module>", "h *= 0.5"),
                      category="augmented_assign")
    f = _finding(SaveSite("TanhBackward0", "result", save), [aug])
    assert f.rule == "augmented_assignment"
    assert "1 - t^2" in f.explanation
    assert "`h = h * 0.5` instead of `h *= 0.5`" in f.suggestion


def test_mask_and_slice_assignments():
    save = SourceLocation("m.py", 7, "<module>", "p = torch.softmax(s, -1)")
    mask = WriteRecord(op="aten.index_put_", location=SourceLocation("m.py", 8, "<module>", "p[p < 0.1] = 0.0"),
                       category="index_assign")
    f = _finding(SaveSite("SoftmaxBackward0", "result", save), [mask],
                 TensorInfo((2, 2), "float32", name="p", role="activation"))
    assert f.rule == "mask_assignment"
    assert "`p = p.masked_fill(p < 0.1, 0.0)`" in f.suggestion
    sliced = WriteRecord(op="aten.fill_.Tensor", location=SourceLocation("m.py", 8, "<module>", "p[:, 0] = 0"),
                         category="index_assign")
    f = _finding(SaveSite("SoftmaxBackward0", "result", save), [sliced],
                 TensorInfo((2, 2), "float32", name="p", role="activation"))
    assert f.rule == "index_assignment"
    assert "insert `p = p.clone()` before line 8" in f.suggestion


def test_buffer_refilled_by_a_later_call_of_the_same_forward():
    save = SourceLocation("sn.py", 18, "forward", "sigma = self.u @ self.weight @ v")
    copy = WriteRecord(op="aten.copy_", location=SourceLocation("sn.py", 17, "forward", "self.u.copy_(u_new)"),
                       category="copy")
    f = _finding(SaveSite("MmBackward0", "self", save), [copy],
                 TensorInfo((3,), "float32", name="disc.u", role="buffer"))
    assert f.rule == "buffer_updated_by_second_forward"
    assert "`forward` ran twice before backward" in f.explanation
    assert "use `self.u.clone()` in `sigma = self.u @ self.weight @ v` (line 18)" in f.suggestion


def test_buffer_refilled_between_forward_and_backward():
    save = SourceLocation("m.py", 14, "forward", "return x * self.scale")
    copy = WriteRecord(op="aten.copy_", location=SourceLocation("m.py", 18, "update", "self.scale.copy_(s)"),
                       category="copy")
    backward = SourceLocation("m.py", 28, "<module>", "loss.backward()")
    f = _finding(SaveSite("MulBackward0", "other", save), [copy],
                 TensorInfo((4,), "float32", name="norm.scale", role="buffer"), backward_at=backward.to_dict())
    assert f.rule == "buffer_refill"
    assert f.suggestion.startswith("Refill norm.scale only after `loss.backward()` (line 28)")


def test_unnamed_activation_is_named_by_the_written_variable(source):
    _path, at = source("""
        out = torch.relu(z)
        out += identity
    """)
    aug = WriteRecord(op="aten.add_.Tensor", location=at("out += identity"), category="augmented_assign")
    f = _finding(SaveSite("ReluBackward0", "result", at("out = torch.relu")), [aug])
    assert f.tensor.name == "out"
    assert "`out`, the output of relu" in f.explanation


_SWITCHED_IN_A_LOOP = """
    import torch.nn as nn
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.ReLU())
            for m in self.modules():
                m.inplace = True
    y = net(x)
"""


def test_module_switched_to_inplace_in_a_loop_names_the_switch(source):
    _path, at = source(_SWITCHED_IN_A_LOOP)
    act = WriteRecord(op="aten.relu_", location=at("y = net(x)"), via="net.body.2 (ReLU(inplace=True))",
                      category="activation")
    f = _finding(SaveSite("SigmoidBackward0", "result", at("y = net(x)")), [act])
    line = at("m.inplace = True").line
    assert f.rule == "inplace_flag_set_later"
    assert f.explanation == (
        f"The in-place module net.body.2 (ReLU(inplace=True)) at line {line + 1} overwrote the output of sigmoid, "
        f"which SigmoidBackward0.result saved for backward: sigmoid's gradient is computed from its output s as "
        f"s * (1 - s). Its constructor built it out of place (line {line - 2}: `self.body = nn.Sequential("
        f"nn.Linear(4, 4), nn.Sigmoid(), nn.ReLU())`); `m.inplace = True` at line {line} switched it to in-place "
        f"afterwards.")
    assert f.suggestion.startswith(f"Delete `m.inplace = True` (line {line}), or set it to False: net.body.2 then")
    assert [(x.action, x.line, x.target, x.preferred) for x in f.fixes] == [
        ("remove_statement", line, "m.inplace = True", True)]


def test_module_constructed_inplace_keeps_the_constructor_rule(source):
    """An ``inplace = True`` elsewhere does not hide a constructor that passed inplace=True itself."""
    _path, at = source(_SWITCHED_IN_A_LOOP.replace("nn.ReLU()", "nn.ReLU(inplace=True)"))
    act = WriteRecord(op="aten.relu_", location=at("y = net(x)"), via="net.body.2 (ReLU(inplace=True))",
                      category="activation")
    f = _finding(SaveSite("SigmoidBackward0", "result", at("y = net(x)")), [act])
    assert f.rule == "inplace_activation"


def test_a_switch_that_shares_its_line_gets_no_deletion(source):
    """`for m in ...: m.inplace = True` on one line: deleting the line would delete the loop; the text still
    names the statement."""
    _path, at = source(_SWITCHED_IN_A_LOOP.replace("for m in self.modules():\n                m.inplace = True",
                                                   "for m in self.modules(): m.inplace = True"))
    act = WriteRecord(op="aten.relu_", location=at("y = net(x)"), via="net.body.2 (ReLU(inplace=True))",
                      category="activation")
    f = _finding(SaveSite("SigmoidBackward0", "result", at("y = net(x)")), [act])
    assert f.rule == "inplace_flag_set_later"
    assert "Delete `for m in self.modules(): m.inplace = True`" in f.suggestion
    assert f.fixes == []


def test_inplace_switches_follow_the_path_loops_and_aliases(source):
    from gradguard.core.module_sites import inplace_switches

    path, at = source("""
        self.drop.inplace = True
        self.body[2].inplace = True
        self.body[1].inplace = True
        m.inplace = True
        relu = self.act
        relu.inplace = True
        for _, layer in self.named_modules():
            layer.inplace = True
    """)
    files = [str(path)]
    loop = at("layer.inplace").line
    assert [s.line for s in inplace_switches(files, "self.drop")] == [at("self.drop.inplace").line, loop]
    assert [s.line for s in inplace_switches(files, "net.body.2")] == [at("self.body[2]").line, loop]
    assert [s.line for s in inplace_switches(files, "net.act")] == [at("relu.inplace").line, loop]
    assert len(inplace_switches(files, "")) == 6  # the instance unknown: every switch


# -- rows worded for a framework other than torch (facts the engine copies from the probe) --------------------

_PADDLE_WORDS = {"framework": "Paddle", "direct_writers": "code writing memory directly (numpy views, ctypes)",
                 "direct_write_fix": "Write into a copy.", "optimizer_fix": "Step after backward."}


def test_an_optimizer_step_no_counter_saw_is_worded_for_the_framework():
    step = WriteRecord(op="sgd_", location=SourceLocation("train.py", 9, "<module>", "opt.step()"), via="SGD.step()",
                       bumps_version=False, category="optimizer")
    f = diagnose(Finding(kind="silent_write", tensor=TensorInfo(shape=(2,), dtype="float32", name="net.weight"),
                         saved_at=SaveSite(node="matmul"), modified_at=[step],
                         facts=Facts(optimizers_bump_versions=False, **_PADDLE_WORDS)))
    assert f.rule == "optimizer_step_before_backward"
    assert f.explanation == (
        "SGD.step() at train.py:9 updated net.weight in place after matmul saved it for a backward pass that had not "
        "run yet. Paddle's optimizers do not bump the version counter, so Paddle computes that backward with the "
        "updated values and no error.")
    assert f.suggestion == "Step after backward."


def test_a_write_no_framework_op_made_is_worded_for_the_framework():
    f = diagnose(Finding(kind="silent_write", tensor=TensorInfo(shape=(2,), dtype="float32"),
                         saved_at=SaveSite(node="exp"), modified_at=[], facts=Facts(**_PADDLE_WORDS)))
    assert f.rule == "silent_kernel_write"
    assert f.explanation == (
        "No Paddle op that gradguard watches wrote it, so the writer is code writing memory directly (numpy views, "
        "ctypes). Re-run with `gradguard.guard(bisect=True)` to pin it to a line. exp still needed the old values.")
    assert f.suggestion == "Write into a copy."
    torch_words = diagnose(Finding(kind="silent_write", tensor=TensorInfo(shape=(2,), dtype="float32"),
                                   saved_at=SaveSite(node="exp"), modified_at=[]))
    assert "No torch op, custom autograd.Function or Triton launch" in torch_words.explanation
