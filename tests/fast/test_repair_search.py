"""The general repair search of ``gradguard fix`` (NOTE [Repairs from the mechanism, not the rule id]): the
out-of-place table read from the tensor type, the module instance resolved to its construction, and the one
rewrite behind both the suggestion text and the edit. End to end (``gradguard fix --apply`` on reproductions of
public reports): tests/slow/test_fix_repair_search.py."""

from __future__ import annotations

import textwrap

import pytest
# The out-of-place table is the loaded framework's tensor type (NOTE [Out-of-place methods come from the
# framework]): import torch here, so that these tests do not depend on another test having imported it.
import torch  # noqa: F401


@pytest.mark.parametrize("code, expected", [
    ("x.normal_()", None),
    ("x.zero_()", None),
    ("x.bernoulli_(0.5)", None),
    ("angles = angles.div_(n)", "angles = angles.div(n)"),
    ("y = x.clamp_(0, 1)", "x = x.clamp(0, 1); y = x"),
    ("out = a - t.mul_(k)", "t = t.mul(k); out = a - t"),
    ("return e.renorm_(2, 0, 1.0)", "e = e.renorm(2, 0, 1.0); return e"),
    ("x.index_add_(0, i, v)", "x = x.index_add(0, i, v)"),
    ("torch.sigmoid_(x)", "x = torch.sigmoid(x)"),
    ("F.relu(x, inplace=True)", "x = F.relu(x)"),
    ("h *= 0.5", "h = h * 0.5"),
    ("last.detach_()", "last = last.detach()"),
    ("target.requires_grad_(False)", "target = target.detach()"),  # autograd switched off: a detached tensor
    ("self.f.requires_grad = False", "self.f = self.f.detach()"),
    ("embeds.requires_grad = True", "embeds.retain_grad()"),  # it requires grad already: its .grad is what is wanted
    ("x.requires_grad_(True)", None),
    ("torch.mul(y, 2, out=y)", "y = torch.mul(y, 2)"),
])
def test_the_out_of_place_table_comes_from_the_tensor_type(code, expected):
    from gradguard.core.fixes import out_of_place

    assert out_of_place(code) == expected


def test_module_sites_follow_sequential_comprehension_and_factory(tmp_path):
    from gradguard.core.module_sites import inplace_switches, instance_sites

    source = tmp_path / "model.py"
    source.write_text(textwrap.dedent("""
        import torch.nn as nn


        def act():
            return nn.ReLU(inplace=True)


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.ModuleList([nn.ReLU(inplace=True) for _ in range(3)])
                self.body = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True), nn.ReLU(inplace=True))
                self.tail = nn.Sequential(nn.Linear(2, 2), act())
                for m in self.modules():
                    m.inplace = True
        """).lstrip())
    files = [str(source)]
    assert [(s.location.line, s.occurrence) for s in instance_sites(files, "self.blocks.1", "ReLU")] == [(11, None)]
    assert [(s.location.line, s.occurrence) for s in instance_sites(files, "net.body.2", "ReLU")] == [(12, 1)]
    assert [(s.location.line, s.occurrence) for s in instance_sites(files, "net.tail.1", "ReLU")] == [(5, None)]
    assert instance_sites(files, "net.body.5", "ReLU") == []
    assert [s.line for s in inplace_switches(files, "net.tail")] == [15]


def test_suggestion_text_and_edit_come_from_one_rewrite(tmp_path):
    """The hunk gradguard fix applies is the statement the suggestion shows."""
    from gradguard.core.intents import FixIntent
    from gradguard.core.fixes import out_of_place
    from gradguard.fix import apply_intent

    code = "y = x.div_(n)  # normalise\n"
    text = out_of_place(code)
    edited = apply_intent(code, FixIntent("inplace_to_out_of_place", "f.py", 1))
    assert "; ".join(line.split("#")[0].strip() for line in edited.splitlines()) == text


def test_candidates_come_from_the_write_and_the_save_whatever_the_rule(tmp_path):
    """No rule id is read: a finding with an unknown rule still gets the write out of place (or into a clone when
    the method has no out-of-place form), then a copy at the save point, in that order."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text("import torch\nw = torch.ones(2, requires_grad=True)\ny = torch.sigmoid(w)\ny.normal_()\n"
                      "z = y.div_(2)\n")
    file = str(script)
    finding = {"kind": "inplace_modification", "rule": "no_such_rule", "tensor": {"name": "y"},
               "saved_at": {"file": file, "line": 3, "argument": "result"},
               "modified_at": [{"file": file, "line": 4, "category": "other"},
                               {"file": file, "line": 5, "category": "other"}]}
    repairs = general_repairs(finding, {}, lambda path: True)
    assert [(r[0].action, r[0].line, r[0].detail.get("code")) for r in repairs] == [
        ("insert_before", 4, "y = y.clone()"),  # normal_: no out-of-place method
        ("inplace_to_out_of_place", 5, None),
        ("insert_before", 5, "y = y.clone()"),
        ("clone_assignment", 3, None),
        ("clone_expression", 3, None),  # an operand of the saver: `torch.sigmoid(w.clone())`
    ]
    assert "z = y" in repairs[1][0].reason
    finding["modified_at"][0]["category"] = "optimizer"  # a copy of stepped weights would hide the bug
    assert all(r[0].action != "clone_assignment" for r in general_repairs(finding, {}, lambda path: True))


def test_an_output_saved_by_its_op_is_copied_where_it_is_bound_whatever_the_write_calls_it(tmp_path):
    """The write reaches the saved output by another name (`out[0][...]` of a returned tuple): the copy goes on the
    assignment that binds the op's output at the save point."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text("import torch\n\ndef enc(x):\n    h = torch.tanh(x)\n    return (h, x)\n\n"
                      "out = enc(torch.ones(3, requires_grad=True))\nout[0][0] = 1.0\n")
    file = str(script)
    finding = {"kind": "inplace_modification", "rule": "index_assignment", "tensor": {"name": "out[0]"},
               "saved_at": {"file": file, "line": 4, "argument": "result"},
               "modified_at": [{"file": file, "line": 8, "category": "index_assign"}]}
    repairs = general_repairs(finding, {}, lambda path: True)
    assert [(r[0].action, r[0].line, r[0].target) for r in repairs if r[0].line == 4] == [
        ("clone_assignment", 4, "h"), ("clone_expression", 4, "x")]


def test_a_written_element_of_a_container_is_rebound_then_left_standing_then_cloned_element_first(tmp_path):
    """NOTE [An in-place call whose receiver cannot be rebound]: ``hs[0]`` may be a list's element (rebound), a
    tuple's (the call stands where it is) or a tensor's row (a clone of ``hs`` before the write): the candidates
    come in that order and the verifying run picks; the copy at the save is of the element, not the list."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text("import torch\na = torch.ones(2, requires_grad=True)\nhs = [a * 1.5]\ns = hs[0].pow(2)\n"
                      "g = hs[0].exp_()\n")
    file = str(script)
    finding = {"kind": "inplace_modification", "rule": "no_such_rule", "tensor": {"name": "hs[0]"},
               "saved_at": {"file": file, "line": 4, "argument": "self"},
               "modified_at": [{"file": file, "line": 5, "category": "other"}]}
    repairs = general_repairs(finding, {}, lambda path: True)
    assert [(r[0].action, r[0].detail.get("stands") or r[0].detail.get("code"), r[0].target) for r in repairs] == [
        ("inplace_to_out_of_place", None, "hs[0]"),  # hs[0] = hs[0].exp(); g = hs[0]
        ("inplace_to_out_of_place", True, "g"),  # g = hs[0].exp()
        ("insert_before", "hs[0] = hs[0].clone()", "hs[0]"),
        ("insert_before", "hs = hs.clone()", "hs"),
        ("clone_expression", None, "hs[0]"),
        ("clone_expression", None, "hs"),  # a tensor's row: `s = hs.clone()[0].pow(2)`
    ]


def test_the_module_instance_that_wrote_is_resolved_from_its_path(tmp_path):
    from gradguard.fix.search import general_repairs

    script = tmp_path / "m.py"
    script.write_text(textwrap.dedent("""
        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.stem = nn.Sequential(nn.Linear(8, 8), nn.ReLU(True))
                self.gate = nn.Sequential(nn.Linear(8, 8), nn.Sigmoid(), nn.ReLU(True))

            def forward(self, x):
                return self.gate(self.stem(x))
        """).lstrip())
    file = str(script)
    finding = {"kind": "inplace_modification", "tensor": {}, "saved_at": {"file": file, "line": 11},
               "modified_at": [{"file": file, "line": 11, "category": "activation",
                                "via": "self.gate.2 (ReLU(inplace=True))"}]}
    (repair,) = general_repairs(finding, {}, lambda path: True)
    assert (repair[0].action, repair[0].line, repair[0].detail) == (
        "set_keyword", 8, {"call": "ReLU", "keyword": "inplace", "value": False, "position": 0})
    from gradguard.fix import apply_intents

    assert "nn.Sigmoid(), nn.ReLU(False))" in apply_intents(script.read_text(), repair)
    assert "nn.Linear(8, 8), nn.ReLU(True))\n" in apply_intents(script.read_text(), repair)


def test_an_earlier_backward_of_another_loss_on_the_same_forward_retains_its_graph(tmp_path):
    """(f): two losses of one forward backpropagated in turn: retain_graph=True on the first, before any detach
    (it keeps both gradients). Not with a step between them, nor for one statement that runs twice."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text("import torch\nw = torch.ones(3, requires_grad=True)\nh = torch.tanh(w)\n"
                      "loss_a = h.sum()\nloss_a.backward()\nloss_b = h.pow(2).sum()\nloss_b.backward()\n")
    file = str(script)
    at = lambda line: {"file": file, "line": line, "function": "<module>"}  # noqa: E731
    finding = {"kind": "backward_twice", "rule": "no_such_rule", "tensor": {"name": "h"},
               "saved_at": {**at(3), "code": "h = torch.tanh(w)"},
               "modified_at": [{**at(5), "code": "loss_a.backward()", "category": "backward"}],
               "context": {"backward_at": {**at(7), "code": "loss_b.backward()"}}}
    repairs = general_repairs(finding, {}, lambda path: True)
    assert (repairs[0][0].action, repairs[0][0].line, repairs[0][0].detail) == (
        "set_keyword", 5, {"call": "backward", "keyword": "retain_graph", "value": True, "add": True})
    assert repairs[1][0].action == "detach_assignment"

    stepped = tmp_path / "stepped.py"
    stepped.write_text(script.read_text().replace("loss_b = h", "opt.step()\nloss_b = h"))
    for site in (finding["saved_at"], finding["modified_at"][0], finding["context"]["backward_at"]):
        site["file"] = str(stepped)
    finding["context"]["backward_at"]["line"] = 8
    assert all(r[0].action != "set_keyword" for r in general_repairs(finding, {}, lambda path: True))
    for site in (finding["saved_at"], finding["modified_at"][0], finding["context"]["backward_at"]):
        site["file"] = file
    finding["context"]["backward_at"]["line"] = 5  # the same backward statement, run again
    assert all(r[0].action != "set_keyword" for r in general_repairs(finding, {}, lambda path: True))
    twice = tmp_path / "twice.py"  # the same loss backpropagated by a second statement
    twice.write_text(script.read_text().replace("loss_b.backward()", "loss_a.backward()"))
    for site in (finding["saved_at"], finding["modified_at"][0], finding["context"]["backward_at"]):
        site["file"] = str(twice)
    finding["context"]["backward_at"].update(line=7, code="loss_a.backward()")
    assert all(r[0].action != "set_keyword" for r in general_repairs(finding, {}, lambda path: True))
    finding["modified_at"][0]["code"] = finding["context"]["backward_at"]["code"] = "(loss_a + 1).backward()"
    assert all(r[0].action != "set_keyword" for r in general_repairs(finding, {}, lambda path: True))
    finding["modified_at"][0]["code"] = "loss_a.backward()"
    finding["context"]["backward_at"]["code"] = "loss_b.backward()"  # the control: another loss gets the candidate
    assert general_repairs(finding, {}, lambda path: True)[0][0].action == "set_keyword"


def test_a_fresh_forward_recomputes_what_the_loss_made_after_the_step_reads(tmp_path):
    """(e): the later loss is made after the step (`actor_loss = -value.mean()`) from a value a call made before it
    (`value, critic_loss = losses(z)`, the save's caller line): that call is the forward run again after the step."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import torch
        net = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        def losses(z):
            value = net(z)
            return value, value.pow(2).mean()
        for _ in range(2):
            value, critic_loss = losses(torch.ones(3, 2))
            critic_loss.backward(retain_graph=True)
            opt.step()
            actor_loss = -value.mean()
            actor_loss.backward()
        """).lstrip())
    file = str(script)
    finding = {"kind": "inplace_modification", "rule": "no_such_rule", "tensor": {"name": "net.weight"},
               "saved_at": {"file": file, "line": 5, "chain": [{"file": file, "line": 8}]},
               "modified_at": [{"file": file, "line": 10, "category": "optimizer", "code": "opt.step()"}],
               "context": {"backward_at": {"file": file, "line": 12, "code": "actor_loss.backward()"}}}
    fresh = [r for r in general_repairs(finding, {}, lambda path: True) if r[0].action == "insert_after"]
    assert [(r[0].line, r[0].detail["code"]) for r in fresh] == [(10, "value, critic_loss = losses(torch.ones(3, 2))")]


def test_a_state_a_module_carries_by_its_own_assignment_is_detached_where_it_is_read(tmp_path):
    """(d): the crossing tensor is `runner.h` to the caller and `self.h` where it is made; the assignment that
    saved it reads the previous step's value on its right, and that read is the candidate, not the assignment."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import torch
        class Runner(torch.nn.Module):
            def forward(self, x):
                self.h = cell(x, self.h)
                return self.h
        for x in xs:
            loss = runner(x).sum()
            loss.backward()
        """).lstrip())
    file = str(script)
    finding = {"kind": "backward_twice", "rule": "no_such_rule", "tensor": {"name": "runner.h"},
               "saved_at": {"file": file, "line": 4},
               "modified_at": [{"file": file, "line": 8, "category": "backward"}],
               "context": {"backward_at": {"file": file, "line": 8, "code": "loss.backward()"}}}
    reads = [(r[0].line, r[0].target, r[0].detail) for r in general_repairs(finding, {}, lambda path: True)
             if r[0].action == "detach_expression"]
    assert reads == [(4, "self.h", {}), (4, "self.h", {"each": True})]  # the second for a tuple of tensors


def test_a_rebinding_of_a_loop_variable_or_parameter_nothing_reads_after_is_not_a_repair(tmp_path):
    """`for p in parts: p = p.mul(0.5)` and `def update(t): t = t.mul(2)` drop the write (the script would run clean
    with other numbers); a later read of the variable in the loop (or the function) keeps the rebinding a repair."""
    from gradguard.core.intents import FixIntent
    from gradguard.fix.search import rebinds_a_lost_name

    script = tmp_path / "s.py"
    script.write_text("for p in parts:\n    p.mul_(0.5)\nfor q in parts:\n    q.mul_(0.5)\n    out.append(q)\n"
                      "h = x * 2\nh.mul_(0.5)\ndef update(t):\n    t.mul_(2)\ndef scaled(t):\n    t.mul_(2)\n"
                      "    return t\ndef act(t):\n    F.relu(t, inplace=True)\ndef out(t):\n"
                      "    return F.relu(t, inplace=True)\n")
    file = str(script)
    lost = [rebinds_a_lost_name(FixIntent(action, file, line, target=name))
            for action, line, name in (("inplace_to_out_of_place", 2, "p"), ("insert_before", 2, "p"),
                                       ("inplace_to_out_of_place", 4, "q"), ("inplace_to_out_of_place", 7, "h"),
                                       ("detach_expression", 2, "p"), ("inplace_to_out_of_place", 9, "t"),
                                       ("inplace_to_out_of_place", 11, "t"), ("set_keyword", 14, None),
                                       ("set_keyword", 16, None))]
    # `t = F.relu(t, inplace=False)` is lost too; `return F.relu(t, inplace=False)` rebinds nothing
    assert lost == [True, True, False, False, False, True, False, True, False]


def test_the_copy_at_the_save_tries_each_operand_the_saver_read_but_never_what_the_statement_writes(tmp_path):
    """A recurrence into a preallocated buffer: `out[t - 1]` is what the saver read (cloning a read changes no
    value and no gradient, so each operand is a safe candidate); `out[t]`, `out` and `t` are what the statement
    writes in place, where a clone would drop the write."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text("import torch\nw = torch.ones(3, 3, requires_grad=True)\nout = torch.zeros(4, 3)\n"
                      "for t in range(1, 4):\n    out[t].copy_(torch.tanh(out[t - 1] @ w))\n")
    file = str(script)
    finding = {"kind": "inplace_modification", "rule": "no_such_rule", "tensor": {"name": "out"},
               "saved_at": {"file": file, "line": 5, "argument": "self"},
               "modified_at": [{"file": file, "line": 5, "category": "other"}]}
    clones = [r[0].target for r in general_repairs(finding, {}, lambda path: True)
              if r[0].action == "clone_expression"]
    assert clones == ["out[t - 1]", "w"]


def test_every_tensor_a_state_carries_by_its_own_assignment_is_detached_at_once(tmp_path):
    """(d): an LSTM's state unpacked (`h, c = cell(x, (h, c))`) carries both tensors into the freed graph: one
    candidate detaches both reads (detaching `h` alone leaves `c` a path); a state held as one tuple (`self.state =
    cell(x, self.state)`) is also tried element by element. The finding's own fix text says the same."""
    from gradguard.core.edits import apply_intents
    from gradguard.core.findings import SourceLocation
    from gradguard.core.fixes import carried_state
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    source = textwrap.dedent("""
        import torch
        for x in xs:
            h, c = cell(x, (h, c))
            loss = head(h).sum()
            loss.backward()
        """).lstrip()
    script.write_text(source)
    file = str(script)
    finding = {"kind": "backward_twice", "rule": "no_such_rule", "tensor": {"name": "h"},
               "saved_at": {"file": file, "line": 3},
               "modified_at": [{"file": file, "line": 5, "category": "backward"}],
               "context": {"backward_at": {"file": file, "line": 5, "code": "loss.backward()"}}}
    reads = [r for r in general_repairs(finding, {}, lambda path: True) if r[0].action == "detach_expression"]
    assert [apply_intents(source, r).splitlines()[2] for r in reads] == [
        "    h, c = cell(x, (h.detach(), c.detach()))",
        "    h, c = cell(x, (tuple(s.detach() for s in h), tuple(s.detach() for s in c)))"]
    state = next(s for s in carried_state(SourceLocation(file, 5, "<module>", "loss.backward()")) if s.name == "h")
    assert state.reads_itself == ("h", "c")
    assert state.detach_fix() == "`h, c = cell(x, (h.detach(), c.detach()))` (line 3)"
    assert state.detach_intent().reason == "detach `h` and `c` where they cross into the next iteration"


def test_a_step_and_backward_inside_a_helper_stand_at_their_calls_for_the_fresh_forward(tmp_path):
    """(e): `update(opt, loss)` does zero_grad, backward and step; the step (in update) ran between the save and the
    second loss's backward (also in update). Lifted to their calls in the save's block, the step is the first
    `update(...)` after the save and the backward the next: the forward the second loss reads is run again there."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import torch
        def update(opt, loss):
            opt.zero_grad()
            loss.backward(retain_graph=True)
            opt.step()
        for _ in range(2):
            score = disc(gen(z))
            loss_d = score.pow(2).mean()
            update(opt_d, loss_d)
            loss_g = score.mean()
            update(opt_g, loss_g)
        """).lstrip())
    file = str(script)
    finding = {"kind": "inplace_modification", "rule": "no_such_rule", "tensor": {"name": "disc.weight"},
               "saved_at": {"file": file, "line": 7, "function": "<module>"},
               "modified_at": [{"file": file, "line": 5, "function": "update", "category": "optimizer",
                                "code": "opt.step()"}],
               "context": {"backward_at": {"file": file, "line": 4, "function": "update",
                                           "code": "loss.backward(retain_graph=True)"}}}
    fresh = [r for r in general_repairs(finding, {}, lambda path: True) if r[0].action == "insert_after"]
    assert [(r[0].line, r[0].detail["code"]) for r in fresh] == [(9, "score = disc(gen(z))")]


def _edited(source: str, tmp_path, finding_of, action=None) -> list[str]:
    """The whole-file results of ``general_repairs``' candidates (of ``action`` when given) on ``source``."""
    from gradguard.core.edits import EditNotApplicable, apply_intents
    from gradguard.fix.search import general_repairs

    script = tmp_path / f"s{len(list(tmp_path.iterdir()))}.py"  # a new name: sources are cached by file name
    script.write_text(source)
    finding = finding_of(str(script))
    edited = []
    for repair in general_repairs(finding, {}, lambda path: True):
        try:
            edited += [apply_intents(source, repair)] if action is None or repair[0].action == action else []
        except EditNotApplicable:  # a candidate that does not fit this source: verification would say so
            pass
    return edited


def test_a_hand_written_update_of_weights_moves_after_the_backward_as_the_statement_that_holds_it(tmp_path):
    """(e) from the write, not from `opt.step()`: a decay by hand under `no_grad` (a write into a parameter) before
    the backward that needs the old weights moves after it, as the `with` block of the backward's block that holds
    the write; a write in a helper moves as the helper's call."""
    source = textwrap.dedent("""
        import torch
        def decay(model):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.99)
        for _ in range(2):
            loss = net(x).sum()
            with torch.no_grad():
                for p in net.parameters():
                    p.mul_(0.99)
            decay(net)
            loss.backward()
        """).lstrip()

    def finding(write_line, function):
        return lambda file: {
            "kind": "inplace_modification", "rule": "no_such_rule", "tensor": {"name": "net.weight", "role": "parameter"},
            "saved_at": {"file": file, "line": 7, "function": "<module>"},
            "modified_at": [{"file": file, "line": write_line, "function": function, "category": "other",
                             "code": "p.mul_(0.99)"}],
            "context": {"backward_at": {"file": file, "line": 12, "function": "<module>", "code": "loss.backward()"}}}

    moved = _edited(source, tmp_path, finding(10, "<module>"), "move_statement")
    assert [m.splitlines()[7:] for m in moved] == [
        ["    decay(net)", "    loss.backward()", "    with torch.no_grad():", "        for p in net.parameters():",
         "            p.mul_(0.99)"]]
    moved = _edited(source, tmp_path, finding(5, "decay"), "move_statement")
    assert [m.splitlines()[10:] for m in moved] == [["    loss.backward()", "    decay(net)"]]
    # a write into a tensor that is not a parameter is no update of weights: it does not move
    assert _edited(source, tmp_path, lambda file: {**finding(10, "<module>")(file), "tensor": {"name": "h"}},
                   "move_statement") == []


def test_retain_graph_goes_to_autograd_grad_and_to_a_backward_a_helper_follows(tmp_path):
    """(f): `torch.autograd.grad(loss, ...)` frees the graph the later `loss.backward()` needs: retain_graph goes to
    the `grad` call (it accumulates nothing, so the same loss is no objection). A later backward inside a helper
    stands at the helper's call in the earlier backward's block."""
    source = textwrap.dedent("""
        import torch
        def penalise(out):
            out.abs().mean().backward()
        out = net(x)
        norms = torch.autograd.grad(out.sum(), params)
        out.sum().backward()
        loss = out.pow(2).mean()
        loss.backward()
        penalise(out)
        """).lstrip()

    def finding(earlier, later, function, code):
        return lambda file: {
            "kind": "backward_twice", "rule": "no_such_rule", "tensor": {"name": "out"},
            "saved_at": {"file": file, "line": 4, "function": "<module>"},
            "modified_at": [{"file": file, "line": earlier, "function": "<module>", "category": "backward",
                             "code": source.splitlines()[earlier - 1].strip()}],
            "context": {"backward_at": {"file": file, "line": later, "function": function, "code": code}}}

    kept = _edited(source, tmp_path, finding(5, 6, "<module>", "out.sum().backward()"), "set_keyword")
    assert [k.splitlines()[4] for k in kept] == ["norms = torch.autograd.grad(out.sum(), params, retain_graph=True)"]
    kept = _edited(source, tmp_path, finding(8, 3, "penalise", "out.abs().mean().backward()"), "set_keyword")
    assert [k.splitlines()[7] for k in kept] == ["loss.backward(retain_graph=True)"]


def test_gradients_a_later_loss_is_made_of_are_taken_with_a_graph_of_their_own(tmp_path):
    """(f) for a gradient penalty: the later backward goes through what `autograd.grad` returned, so the call gets
    create_graph=True (retain_graph alone would run clean and silently drop the penalty's gradient)."""
    source = textwrap.dedent("""
        import torch
        y = net(x).sum()
        (gx,) = torch.autograd.grad(y, x)
        penalty = gx.pow(2).sum()
        (y + penalty).backward()
        """).lstrip()

    def finding(file):
        return {"kind": "backward_twice", "rule": "no_such_rule", "tensor": {"name": "y"},
                "saved_at": {"file": file, "line": 2, "function": "<module>"},
                "modified_at": [{"file": file, "line": 3, "function": "<module>", "category": "backward",
                                 "code": "(gx,) = torch.autograd.grad(y, x)"}],
                "context": {"backward_at": {"file": file, "line": 5, "function": "<module>",
                                            "code": "(y + penalty).backward()"}}}

    kept = _edited(source, tmp_path, finding, "set_keyword")
    assert [k.splitlines()[2] for k in kept] == ["(gx,) = torch.autograd.grad(y, x, create_graph=True)"]


def test_a_tensor_made_once_before_the_loop_that_backpropagates_it_is_retained_or_made_again_inside(tmp_path):
    """(f) and (g): one backward statement in a loop, through `feat` made before the loop: `feat` made again at the
    top of the loop, alone when the loop steps (retaining the graph would backpropagate through the first
    iteration's values every time), after retain_graph on that backward when it does not; never when making it
    draws new data. Not for a state the loop assigns itself (`h = cell(x, h)`: that is (d)'s)."""
    source = textwrap.dedent("""
        import torch
        feat = enc(x)
        for _ in range(2):
            loss = head(feat).sum()
            loss.backward()
            opt.step()
        """).lstrip()

    def finding(file):
        return {"kind": "backward_twice", "rule": "no_such_rule", "tensor": {"name": "feat"},
                "saved_at": {"file": file, "line": 2, "function": "<module>"},
                "modified_at": [{"file": file, "line": 5, "function": "<module>", "category": "backward",
                                 "code": "loss.backward()"}],
                "context": {"backward_at": {"file": file, "line": 5, "function": "<module>",
                                            "code": "loss.backward()"}}}

    edits = _edited(source, tmp_path, finding)
    assert edits[0].splitlines()[:4] == ["import torch", "for _ in range(2):", "    feat = enc(x)",
                                         "    loss = head(feat).sum()"]
    assert not any("retain_graph" in e for e in edits)
    no_step = _edited(source.replace("    opt.step()\n", ""), tmp_path, finding)
    assert "    loss.backward(retain_graph=True)" in no_step[0].splitlines()
    assert no_step[1].splitlines()[:3] == ["import torch", "for _ in range(2):", "    feat = enc(x)"]
    # made from a fresh draw (`enc(torch.randn(4, 3))`): made again, each iteration would train on other data
    fresh = _edited(source.replace("enc(x)", "enc(torch.randn(4, 3))"), tmp_path, finding)
    assert not any("for _ in range(2):\n    feat = " in e for e in fresh)
    carried = source.replace("    loss = head(feat).sum()", "    feat = cell(x, feat)\n    loss = head(feat).sum()")
    carried_edits = _edited(carried, tmp_path, lambda file: {**finding(file), "modified_at": [
        {**finding(file)["modified_at"][0], "line": 6}], "context": {"backward_at": {
            **finding(file)["context"]["backward_at"], "line": 6}}})
    assert carried_edits and not any("retain_graph" in e or "    feat = enc(x)" in e.splitlines()
                                     for e in carried_edits)


def test_a_hook_that_writes_its_output_in_place_returns_the_new_value_instead(tmp_path):
    """(a) in a hook: `output.mul_(2)` in a function registered as a forward hook becomes `output =
    output.mul(2)` and `return output` (torch uses the value a hook returns); the same write in a function no
    hook registration names is not rewritten that way (its rebinding would drop the write)."""
    source = textwrap.dedent("""
        import torch
        def scale(module, inputs, output):
            output.mul_(2)
        def helper(module, inputs, output):
            output.mul_(2)
        net[1].register_forward_hook(scale)
        """).lstrip()

    def finding(line, function):
        return lambda file: {
            "kind": "inplace_modification", "rule": "no_such_rule", "tensor": {"name": "output"},
            "saved_at": {"file": file, "line": 6, "function": "<module>"},
            "modified_at": [{"file": file, "line": line, "function": function, "category": "other",
                             "code": "output.mul_(2)"}]}

    from gradguard.fix.search import rebinds_a_lost_name

    script = tmp_path / "hooks.py"
    script.write_text(source)
    returned = [e.splitlines()[1:4] for e in _edited(source, tmp_path, finding(3, "scale"))
                if "return output" in e]
    assert returned == [["def scale(module, inputs, output):", "    output = output.mul(2)", "    return output"]]
    assert not any("return output" in e for e in _edited(source, tmp_path, finding(5, "helper")))
    from gradguard.fix.search import general_repairs

    repair = next(r for r in general_repairs(finding(3, "scale")(str(script)), {}, lambda path: True) if len(r) == 2)
    assert not any(map(rebinds_a_lost_name, repair))



def test_a_write_into_a_loops_variable_copies_the_items_of_what_the_loop_walks_before_the_loop(tmp_path):
    """(c) for a loop's variable: `p = p.mul(0.5)` would drop the write, so the items of `parts` are copied just
    before the loop (which then writes the copies read after it), whatever made `parts`; a loop over an
    expression, whose pieces nothing reads after, gets no such candidate."""
    source = textwrap.dedent("""
        import torch
        parts = h.split(2, dim=0)
        for p in parts:
            p.mul_(0.5)
        for q in h.chunk(2):
            q.mul_(0.5)
        """).lstrip()

    def finding(line, code):
        return lambda file: {
            "kind": "view_inplace", "rule": "no_such_rule", "tensor": {"name": code[0]},
            "saved_at": {}, "modified_at": [{"file": file, "line": line, "function": "<module>", "category": "other",
                                             "code": code}]}

    copied = [e for e in _edited(source, tmp_path, finding(4, "p.mul_(0.5)"), "insert_before")
              if "clone() for" in e]
    assert [e.splitlines()[1:4] for e in copied] == [
        ["parts = h.split(2, dim=0)", "parts = [p.clone() for p in parts]", "for p in parts:"]]
    assert not any("clone() for" in e for e in _edited(source, tmp_path, finding(6, "q.mul_(0.5)")))

    def weights(file):  # an update of weights by hand would go to copies
        return {**finding(4, "p.mul_(0.5)")(file), "tensor": {"name": "p", "role": "parameter"}}

    assert not any("clone() for" in e for e in _edited(source, tmp_path, weights))

def test_a_detach_that_leaves_a_later_step_without_gradients_is_refused_though_the_original_never_stepped():
    """NOTE [A fix must keep the gradients the optimizer uses]: the original run failed at its second backward,
    before any step, so its steps used nothing; the edited run's step after that backward is of an optimizer whose
    parameters the original's backward reached and the edited one reaches none of (keys from the optimizers'
    construction). An optimizer the edited backward still feeds may lose one parameter's gradient (a cache built
    from a learned scale, detached where it is read)."""
    from gradguard.fix.verify import RunResult, lost_gradients

    before = RunResult(1, [], "", coverage=[{"used": set(), "reached": {"0:0", "1:0"}},
                                            {"used": set(), "reached": {"0:0", "1:0"}}])
    cut = RunResult(0, [], "", coverage=[{"used": set(), "reached": {"1:0"}, "stepped": set()},
                                         {"used": set(), "reached": {"1:0"}, "stepped": {"0:0"}}])
    kept = RunResult(0, [], "", coverage=[{"used": set(), "reached": {"0:0", "1:0"}, "stepped": set()},
                                          {"used": {"0:0"}, "reached": {"0:0", "1:0"}, "stepped": {"0:0"}}])
    assert lost_gradients(before, cut) == (
        "backward call 2 no longer reaches 1 of the 1 parameters that the optimizer step after it updates "
        "(optimizer 1 in the order they are made): the error goes away, but so does their gradient")
    assert lost_gradients(before, kept) is None
    one_fed = RunResult(0, [], "", coverage=[{"used": set(), "reached": {"0:0", "1:0"}, "stepped": set()},
                                             {"used": {"0:1"}, "reached": {"0:1"}, "stepped": {"0:0", "0:1"}}])
    assert lost_gradients(before, one_fed) is None


def test_a_crossing_tensor_is_also_detached_where_a_method_reads_it(tmp_path):
    """The later loss reads the crossing tensor as a method's receiver (`h = posts.reshape(-1, 8)`), not as an
    argument: detaching it there is a candidate too; its metadata (`posts.shape`) is no read of its graph."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text("import torch\nposts = make()\nmodel_loss = dec(posts) + rew(posts)\nmodel_loss.backward()\n"
                      "n = posts.shape[0]\nh = posts.reshape(-1, 8)\nactor_loss = h.sum()\nactor_loss.backward()\n")
    file = str(script)
    finding = {"kind": "backward_twice", "rule": "freed_graph_reused", "tensor": {"name": "posts"},
               "saved_at": {"file": file, "line": 2},
               "context": {"backward_at": {"file": file, "line": 8, "code": "actor_loss.backward()"}},
               "modified_at": [{"file": file, "line": 4, "category": "backward"}]}
    repairs = [(r[0].action, r[0].line, r[0].target, r[0].detail.get("call"))
               for r in general_repairs(finding, {}, lambda path: True) if r[0].line in (3, 5, 6)]
    assert repairs == [("detach_argument", 3, "posts", "dec"), ("detach_argument", 3, "posts", "rew"),
                       ("detach_expression", 6, "posts", None)]


def test_gradients_taken_of_the_loss_a_later_backward_needs_retain_its_graph(tmp_path):
    """(f): `torch.autograd.grad(loss, ...)` then `loss.backward()`: the same loss, but autograd.grad returns its
    gradients into no .grad, so retaining the graph adds nothing twice (a gradient norm logged before the step)."""
    from gradguard.fix.search import general_repairs

    script = tmp_path / "s.py"
    script.write_text("import torch\nw = torch.ones(3, requires_grad=True)\nloss = torch.tanh(w).sum()\n"
                      "norms = torch.autograd.grad(loss, [w])\nloss.backward()\n")
    file = str(script)
    at = lambda line, code: {"file": file, "line": line, "function": "<module>", "code": code}  # noqa: E731
    finding = {"kind": "backward_twice", "rule": "backward_twice", "tensor": {"name": "loss"},
               "saved_at": at(3, "loss = torch.tanh(w).sum()"),
               "modified_at": [{**at(4, "norms = torch.autograd.grad(loss, [w])"), "category": "backward"}],
               "context": {"backward_at": at(5, "loss.backward()")}}
    first = general_repairs(finding, {}, lambda path: True)[0][0]
    assert (first.action, first.line, first.detail) == (
        "set_keyword", 4, {"call": "grad", "keyword": "retain_graph", "value": True, "add": True})
