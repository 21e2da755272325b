"""Diagnosis as data: every rule's fix comes as structured FixIntents that match its text, every code
suggestion is valid Python, and the failure classes of the real-world corpus (issue 12) are diagnosed
right on small reproductions run under the real guard."""

from __future__ import annotations

import ast
import linecache
import re
import textwrap

import pytest

import gradguard
from gradguard.core.diagnosis import RULES, diagnose
from gradguard.core.facts import Facts
from gradguard.core.findings import Finding, SaveSite, SourceLocation, TensorInfo, WriteRecord
from gradguard.core.intents import ACTIONS

_BACKTICK = re.compile(r"`([^`]+)`")
_PLACEHOLDERS = ("?[]", "the tensor = the tensor", "line ?", "None.clone()", "`None`")


def _script(tmp_path, text: str):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    linecache.checkcache(str(path))
    lines = path.read_text().splitlines()

    def at(code: str) -> SourceLocation:
        number = next(i for i, line in enumerate(lines, 1) if line.strip().startswith(code))
        return SourceLocation(str(path), number, "<module>", lines[number - 1].strip())

    return path, at


def _run_guarded(tmp_path, text: str) -> gradguard.GradientHazardError:
    path, at = _script(tmp_path, text)
    with pytest.raises(gradguard.GradientHazardError) as caught:
        exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__"})
    return caught.value, at


def _assert_clean_text(f: Finding) -> None:
    for text in (f.explanation, f.suggestion, f.tensor.label):
        for placeholder in _PLACEHOLDERS:
            assert placeholder not in text, (placeholder, text)
    for code in _BACKTICK.findall(f.suggestion):
        if re.match(r"^[\w.]+$", code) or code.startswith(("gradguard ", "python ")):
            continue  # a bare name, not a statement
        ast.parse(code.strip())  # every code suggestion is valid Python


def _hand_built(tmp_path):
    """One finding per rule of the table that a hand-built write can reach."""
    _path, at = _script(tmp_path, """
        import torch
        h_cur = h0
        gate = nn.Sequential(nn.Sigmoid(), nn.ReLU(inplace=True))
        for i in range(3):
            out = gate(x)
            out += bias
            probs[probs < 0.1] = 0.0
            feats[:, 0] = 0
            y, h_next = model(x, h_cur)
            loss = y.sum()
            loss.backward(retain_graph=True)
            opt.step()
            h_cur = h_next
        g_loss = -D(fake)
        opt_d.step()
        g_loss.backward()
        opt_g.step()
        self.u.copy_(v)
        out[t] = torch.sigmoid(out[t - 1] * w)
    """)
    saver = SaveSite("AddmmBackward0", "mat2", at("y, h_next"))
    sig = SaveSite("SigmoidBackward0", "result", at("out = gate(x)"))
    param = TensorInfo((2, 2), "float32", name="model.weight", role="parameter")

    def make(writes, save=saver, tensor=None, kind="inplace_modification", **facts):
        return diagnose(Finding(kind=kind, tensor=tensor or TensorInfo((2, 2), "float32"), saved_at=save,
                                modified_at=writes, facts=Facts(**facts)))

    step = lambda code, via="SGD.step()": WriteRecord("aten.add_.Tensor", at(code), via=via, category="optimizer")
    return {
        "optimizer_step_before_backward": make([step("opt.step()")], tensor=param, backward_passes_since_save=0,
                                               backward_at=at("loss.backward").to_dict()),
        "retained_graph_across_steps": make([step("opt.step()")], tensor=param, backward_passes_since_save=1,
                                            retain_graph=True, backward_at=at("loss.backward").to_dict()),
        "optimizer_step_between_backwards": make(
            [step("opt_d.step()", "Adam.step()")], SaveSite("AddmmBackward0", "mat2", at("g_loss = -D(fake)")),
            TensorInfo((1, 1), "float32", name="D.weight", role="parameter"), backward_passes_since_save=1,
            backward_at=at("g_loss.backward").to_dict()),
        "inplace_activation": make([WriteRecord("aten.relu_.default", at("out = gate(x)"),
                                                via="gate.1 (ReLU(inplace=True))", category="activation")], sig),
        "augmented_assignment": make([WriteRecord("aten.add_.Tensor", at("out += bias"),
                                                  category="augmented_assign")], sig),
        "mask_assignment": make([WriteRecord("aten.index_put_.default", at("probs[probs"),
                                             category="index_assign")], sig),
        "index_assignment": make([WriteRecord("aten.copy_.default", at("feats[:, 0]"),
                                              category="index_assign")], sig),
        "buffer_refill": make([WriteRecord("aten.copy_.default", at("self.u.copy_(v)"), category="copy")],
                              tensor=TensorInfo((2,), "float32", name="norm.u", role="buffer"),
                              backward_at=at("loss.backward").to_dict()),
        "shared_version_counter": make([WriteRecord("aten.copy_.default", at("out[t] ="),
                                                    category="shared_counter")],
                                       SaveSite("MulBackward0", "self", at("out[t] ="))),
        "unseen_write": make([]),
    }


def test_the_rule_table_is_ordered_data():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    assert names[-1] == "generic_inplace" and names[-2] == "unseen_write"


def test_every_rule_emits_intents_that_match_its_text(tmp_path):
    findings = _hand_built(tmp_path)
    for rule, f in findings.items():
        assert f.rule == rule, (rule, f.rule)
        _assert_clean_text(f)
        for intent in f.fixes:
            assert intent.action in ACTIONS
        if rule == "unseen_write":
            assert not f.fixes
            continue
        assert f.fixes and f.fixes[0].preferred, rule
        lines = {intent.line for intent in f.fixes}
        # the preferred edit's line is the line the text tells the user to edit
        assert any(f"line {n}" in f.suggestion + f.explanation for n in lines), (rule, lines, f.suggestion)
    assert findings["augmented_assignment"].fixes[0].action == "augmented_to_binary"
    assert findings["mask_assignment"].fixes[0].detail == {"method": "masked_fill"}
    retained = findings["retained_graph_across_steps"].fixes
    assert [x.action for x in retained] == ["detach_assignment", "drop_keyword"]
    assert retained[0].target == "h_cur"
    activation = findings["inplace_activation"]
    assert activation.fixes[0].action == "set_keyword"
    assert activation.fixes[0].detail == {"call": "ReLU", "keyword": "inplace", "value": False}
    assert activation.fixes[0].line == 4  # where inplace=True was written, not the call line
    assert "written at line 4" in activation.explanation


def test_no_gan_wording_for_two_models_that_are_not_a_gan(tmp_path):
    _path, at = _script(tmp_path, """
        policy_loss = -critic(actor(s)).mean()
        critic_opt.step()
        policy_loss.backward()
        actor_opt.step()
    """)
    f = diagnose(Finding(kind="inplace_modification",
                         tensor=TensorInfo((1, 1), "float32", name="critic.weight", role="parameter"),
                         saved_at=SaveSite("AddmmBackward0", "mat2", at("policy_loss")),
                         modified_at=[WriteRecord("aten.add_.Tensor", at("critic_opt.step()"), via="Adam.step()",
                                                  category="optimizer")],
                         facts=Facts(backward_passes_since_save=1, backward_at=at("policy_loss.backward").to_dict())))
    assert "GAN" not in f.explanation and "GAN" not in f.suggestion
    _assert_clean_text(f)


def test_preallocated_slots_name_the_write_that_bumped_the_shared_counter(tmp_path):
    error, at = _run_guarded(tmp_path, """
        import torch
        import gradguard
        w = torch.randn(3, requires_grad=True)
        with gradguard.guard():
            out = torch.zeros(4, 3)
            out[0] = w
            for t in range(1, 4):
                out[t] = torch.sigmoid(out[t - 1] * w)
            out.sum().backward()
    """)
    f = error.finding
    line = at("out[t] =").line
    assert f.rule == "shared_version_counter"
    assert f.tensor.name == "out"
    assert [w.location.line for w in f.modified_at] == [line]
    assert "whole buffer's counter" in f.explanation and "no write" not in f.explanation
    assert "torch.stack" in f.suggestion and "`out[t - 1].clone()`" in f.suggestion
    assert f.fixes[0].action == "clone_expression" and f.fixes[0].target == "out[t - 1]"
    _assert_clean_text(f)


def test_backward_twice_names_the_freeing_backward_and_the_crossing_tensor(tmp_path):
    error, at = _run_guarded(tmp_path, """
        import torch
        import gradguard
        G = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh())
        D = torch.nn.Linear(3, 1)
        with gradguard.guard():
            fake = G(torch.randn(4, 2))
            err_fake = D(fake).mean()
            err_fake.backward()
            err_g = -D(fake).mean()
            err_g.backward()
    """)
    f = error.finding
    assert f.kind == "backward_twice" and f.rule == "freed_graph_reused"
    assert f.tensor.name == "fake"
    rows = dict(f.facts.display)
    assert rows["freed by"].startswith(f"the earlier backward at line {at('err_fake.backward()').line}")
    assert rows["crosses"].startswith(f"`fake`, made at line {at('fake = G').line}")
    assert "`D(fake.detach())`" in f.suggestion
    assert (f.fixes[0].action, f.fixes[0].line, f.fixes[0].target) == ("detach_argument", at("err_fake =").line,
                                                                        "fake")
    assert "carried" not in f.explanation and "retain_graph" not in f.suggestion
    _assert_clean_text(f)


def test_inplace_module_names_the_line_where_inplace_true_was_written(tmp_path):
    error, at = _run_guarded(tmp_path, """
        import torch
        import torch.nn as nn
        import gradguard
        net = nn.Sequential(
            nn.Linear(4, 4),
            nn.Sigmoid(),
            nn.Dropout(p=0.5, inplace=True),
        )
        with gradguard.guard():
            net(torch.randn(2, 4, requires_grad=True)).sum().backward()
    """)
    f = error.finding
    written = at("nn.Dropout(").line
    assert f"written at line {written}" in f.explanation
    assert "`nn.Dropout(p=0.5, inplace=False)`" in f.suggestion  # the user's own arguments, no trailing comma
    assert (f.fixes[0].action, f.fixes[0].line) == ("set_keyword", written)
    _assert_clean_text(f)


def test_crossing_recompute_detaches_the_stepped_models_output(tmp_path):
    """FactorVAE (1Konny/FactorVAE#15): `D_z = D(z)` made before the VAE's step and read by D's loss after it."""
    from gradguard.core.findings import SourceLocation
    from gradguard.core.fixes import crossing_recompute

    path = tmp_path / "train.py"
    path.write_text("x_recon, mu, logvar, z = VAE_model(x)\n"    # 1: the call of the stepped model
                    "recon = F.mse_loss(x_recon, x)\n"           # 2: its output, not read after the step
                    "D_z = D(z)\n"                               # 3: the value that crosses
                    "vae_loss = recon + D_z.mean()\n"
                    "vae_loss.backward(retain_graph=True)\n"
                    "optim_VAE.step()\n"                         # 6: the step
                    "D_tc_loss = F.cross_entropy(D_z, zeros)\n"
                    "D_tc_loss.backward()\n")                    # 8: the failing backward

    def at(line):
        return SourceLocation(str(path), line, "<module>")

    assert crossing_recompute(at(1), at(6), at(8)) == ("D_z", "z", "D_z = D(z.detach())")
    assert crossing_recompute(at(1), at(6), at(6)) is None  # nothing reads it between the step and backward
    assert crossing_recompute(None, at(6), at(8)) is None
