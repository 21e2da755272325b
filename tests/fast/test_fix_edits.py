"""Expected-output tests of the source edits ``gradguard fix`` makes from fix intents (the edit is the product:
each test states the exact text before and after)."""

from __future__ import annotations

import pytest

from gradguard.core.intents import FixIntent
from gradguard.fix import EditNotApplicable, apply_intent, apply_intents


def edit(source: str, action: str, line: int, target=None, **detail) -> str:
    return apply_intent(source, FixIntent(action, "f.py", line, target, detail))


def test_detach_assignment_keeps_the_comment():
    assert edit("h = h_next   # carry\n", "detach_assignment", 1, "h") == "h = h_next.detach()   # carry\n"


def test_detach_assignment_parenthesizes_an_operation():
    assert edit("h = a + b\n", "detach_assignment", 1, "h") == "h = (a + b).detach()\n"


def test_detach_assignment_refuses_another_target():
    with pytest.raises(EditNotApplicable, match="does not assign `h`"):
        edit("g = a\n", "detach_assignment", 1, "h")


def test_drop_keyword_last_and_middle():
    assert edit("loss.backward(retain_graph=True)\n", "drop_keyword", 1, call="backward",
                keyword="retain_graph") == "loss.backward()\n"
    assert edit("torch.autograd.backward(l, retain_graph=True, inputs=[w])\n", "drop_keyword", 1,
                call="backward", keyword="retain_graph") == "torch.autograd.backward(l, inputs=[w])\n"


def test_set_keyword_on_a_multiline_call():
    source = "net = nn.Sequential(\n    nn.Linear(4, 4),\n    nn.ReLU(inplace=True),\n)\n"
    assert edit(source, "set_keyword", 3, call="ReLU", keyword="inplace", value=False) == (
        "net = nn.Sequential(\n    nn.Linear(4, 4),\n    nn.ReLU(inplace=False),\n)\n")


def test_augmented_to_binary_parenthesizes_only_when_needed():
    assert edit("x += a * b\n", "augmented_to_binary", 1) == "x = x + a * b\n"
    assert edit("x /= a + b\n", "augmented_to_binary", 1) == "x = x / (a + b)\n"
    assert edit("x -= a - b\n", "augmented_to_binary", 1) == "x = x - (a - b)\n"
    assert edit("self.h[i] *= s  # scale\n", "augmented_to_binary", 1) == "self.h[i] = self.h[i] * s  # scale\n"


def test_inplace_to_out_of_place_forms():
    assert edit("y.mul_(2).add_(1)\n", "inplace_to_out_of_place", 1) == "y = y.mul(2).add(1)\n"
    assert edit("torch.relu_(z)\n", "inplace_to_out_of_place", 1) == "z = torch.relu(z)\n"
    assert edit("q = F.relu(q, inplace=True)\n", "inplace_to_out_of_place", 1) == "q = F.relu(q)\n"
    assert edit("p[p < 0.1] = 0.0\n", "inplace_to_out_of_place", 1, method="masked_fill") == (
        "p = p.masked_fill(p < 0.1, 0.0)\n")
    with pytest.raises(EditNotApplicable, match="expected a mask assignment"):  # a slice is not a mask
        edit("p[1:3] = 0.0\n", "inplace_to_out_of_place", 1, method="masked_fill")


def test_an_inplace_call_whose_receiver_cannot_be_rebound_is_made_out_of_place_where_it_stands():
    # NOTE [An in-place call whose receiver cannot be rebound]: an indexed receiver, a comprehension's variable
    assert edit("hx = [(hx[idx].squeeze_(0)) for idx in range(n)]\n", "inplace_to_out_of_place", 1) == (
        "hx = [(hx[idx].squeeze(0)) for idx in range(n)]\n")
    assert edit("out = [h.relu_() for h in hs]  # keep\n", "inplace_to_out_of_place", 1) == (
        "out = [h.relu() for h in hs]  # keep\n")
    assert edit("a = net(x).relu_()\n", "inplace_to_out_of_place", 1) == "a = net(x).relu()\n"
    assert edit("y = a - t.mul_(k)\n", "inplace_to_out_of_place", 1) == "t = t.mul(k)\ny = a - t\n"  # rebound
    # a subscript is rebound (a list's element), and stands where it is on request (a tuple's): fix tries both
    assert edit("g = hs[0].exp_()\n", "inplace_to_out_of_place", 1) == "hs[0] = hs[0].exp()\ng = hs[0]\n"
    assert edit("g = hs[0].exp_()\n", "inplace_to_out_of_place", 1, stands=True) == "g = hs[0].exp()\n"
    # a value nobody uses: only the rebinding keeps the write (on a tensor's row, the verifying run refuses it)
    assert edit("x[0].mul_(2)\n", "inplace_to_out_of_place", 1, stands=True) == "x[0] = x[0].mul(2)\n"
    with pytest.raises(EditNotApplicable, match="cannot be rebound and the call's value is not used"):
        edit("[h.relu_() for h in hs]\n", "inplace_to_out_of_place", 1)


def test_inplace_false_on_a_call_whose_value_nobody_used_assigns_it_to_what_it_wrote():
    assert edit("F.relu(h, inplace=True)  # act\n", "set_keyword", 1, call="F.relu", keyword="inplace",
                value=False) == "h = F.relu(h, inplace=False)  # act\n"
    assert edit("y = F.relu(h, inplace=True)\n", "set_keyword", 1, call="F.relu", keyword="inplace",
                value=False) == "y = F.relu(h, inplace=False)\n"
    assert edit("layers.append(nn.ReLU(inplace=True))\n", "set_keyword", 1, call="ReLU", keyword="inplace",
                value=False) == "layers.append(nn.ReLU(inplace=False))\n"


def test_detach_and_clone_arguments():
    assert edit("out = netD(fake, 3).view(-1)\n", "detach_argument", 1, "fake", call="netD") == (
        "out = netD(fake.detach(), 3).view(-1)\n")
    assert edit("y = f(a[0])\n", "clone_argument", 1, "a[0]", call="f") == "y = f(a[0].clone())\n"
    with pytest.raises(EditNotApplicable, match="the argument `real` of netD not found"):
        edit("out = netD(fake)\n", "detach_argument", 1, "real", call="netD")


def test_clone_expression_matches_code_ignoring_spaces():
    assert edit("o[t] = f(o[t-1]) * 2\n", "clone_expression", 1, "o[t - 1]") == "o[t] = f(o[t-1].clone()) * 2\n"
    # the right side of an augmented assignment
    assert edit("o[t] += f(o[t - 1])\n", "clone_expression", 1, "o[t - 1]") == "o[t] += f(o[t - 1].clone())\n"


def test_insert_before_a_loop_and_after_a_statement():
    source = "loss = 0\nfor x in xs:\n    loss += f(x)\n"
    assert edit(source, "insert_before", 2, "loss", code="loss = 0") == (
        "loss = 0\nloss = 0\nfor x in xs:\n    loss += f(x)\n")
    source = "for x in xs:\n    h = cell(x, h)\n    y = h\n"
    assert edit(source, "insert_after", 2, "h", code="h = h.detach()") == (
        "for x in xs:\n    h = cell(x, h)\n    h = h.detach()\n    y = h\n")


def test_move_statement_after_another():
    source = "for x in xs:\n    opt.step()\n    loss.backward()\n    log()\n"
    assert edit(source, "move_statement", 2, "opt.step()", after_line=3) == (
        "for x in xs:\n    loss.backward()\n    opt.step()\n    log()\n")


def test_move_next_to_the_same_statement_runs_it_once():
    source = "loss_a.backward(retain_graph=True)\nopt.step()  # early\nloss_b.backward()\nopt.step()\nlog()\n"
    assert edit(source, "move_statement", 2, "opt.step()", after_line=3) == (
        "loss_a.backward(retain_graph=True)\nloss_b.backward()\nopt.step()\nlog()\n")


def test_rebind_a_refilled_buffer_in_a_tuple_target():
    source = "self.obs[:], rewards, self.dones, infos = self.env.step(actions)  # refill\n"
    assert edit(source, "rebind_slice_target", 1, "self.obs") == (
        "self.obs, rewards, self.dones, infos = self.env.step(actions)  # refill\n")
    with pytest.raises(EditNotApplicable, match=r"`obs\[:\]` is not assigned"):
        edit("obs[1:], r = step()\n", "rebind_slice_target", 1, "obs")


def test_wrap_no_grad_drops_data():
    source = "for p in ps:\n    p.data.add_(-lr * p.grad)  # sgd\n"
    assert edit(source, "wrap_no_grad", 2, replace=".data") == (
        "for p in ps:\n    with torch.no_grad():\n        p.add_(-lr * p.grad)  # sgd\n")


def test_two_intents_in_one_file():
    source = "for x in xs:\n    h = cell(x, h)\n    loss.backward(retain_graph=True)\n"
    out = apply_intents(source, [FixIntent("insert_after", "f.py", 2, "h", {"code": "h = h.detach()"}),
                                 FixIntent("drop_keyword", "f.py", 3, None, {"call": "backward",
                                                                             "keyword": "retain_graph"})])
    assert out == "for x in xs:\n    h = cell(x, h)\n    h = h.detach()\n    loss.backward()\n"


def test_intents_that_do_not_fit_say_why():
    with pytest.raises(EditNotApplicable, match="no simple statement at line 9"):
        edit("x = 1\n", "detach_assignment", 9, "x")
    with pytest.raises(EditNotApplicable, match="expected an augmented assignment"):
        edit("x = x + 1\n", "augmented_to_binary", 1)
    with pytest.raises(EditNotApplicable, match="header of a compound statement"):
        edit("for x in xs:\n    pass\n", "detach_assignment", 1, "x")


def test_set_keyword_on_the_second_call_of_a_line():
    source = "net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.ReLU(inplace=True))\n"
    assert edit(source, "set_keyword", 1, call="ReLU", keyword="inplace", value=False, occurrence=1) == (
        "net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.ReLU(inplace=False))\n")


def test_index_loop_variable_over_a_tensor_and_inside_zip():
    source = "for channel, mean in zip(t[0], means):\n    channel.sub_(mean)  # centre\n"
    assert edit(source, "index_loop_variable", 1, "channel", index="i") == (
        "for i, (channel, mean) in enumerate(zip(t[0], means)):\n    channel = t[0][i]\n    channel.sub_(mean)  # centre\n")
    assert edit("for row in x:\n    row.mul_(2)\n", "index_loop_variable", 1, "row", index="k") == (
        "for k, row in enumerate(x):\n    row = x[k]\n    row.mul_(2)\n")


def test_index_loop_variable_refuses_an_iterable_it_would_evaluate_again():
    with pytest.raises(EditNotApplicable, match="plain tensor expression"):
        edit("for row in make():\n    row.mul_(2)\n", "index_loop_variable", 1, "row", index="i")
    with pytest.raises(EditNotApplicable, match="plain tensor expression"):
        edit("for a, b in pairs:\n    a.mul_(2)\n", "index_loop_variable", 1, "a", index="i")


def test_suggestion_text_is_the_edit_text():
    # One rewriter: the text a finding suggests is the line `gradguard fix` writes, spacing included.
    from gradguard.core.fixes import mask_assignment, out_of_place

    for code, masked in [("a.b[a.b>0] = a.b[a.b>0]*2", True), ("x[~keep]=0", True), ("h *= 0.5", False),
                         ("y = x.div_(n)", False)]:
        text = (mask_assignment if masked else out_of_place)(code)
        detail = {"method": "masked_fill"} if masked else {}
        assert text is not None
        assert edit(code + "\n", "inplace_to_out_of_place", 1, **detail).replace("\n", "; ").rstrip("; ") == text
    assert mask_assignment("x[i] = 0") is None  # an index, not a boolean mask: no masked_fill
    assert mask_assignment("a.b[a.b>0] = a.b[a.b>0]*2") == "a.b = a.b.masked_fill(a.b>0, a.b[a.b>0]*2)"


def test_detach_expression_detaches_the_state_where_it_is_read():
    assert (edit("return self.cache[offset:offset + n]\n", "detach_expression", 1, "self.cache")
            == "return self.cache.detach()[offset:offset + n]\n")
    assert edit("out = self.h * x\n", "detach_expression", 1, "self.h") == "out = self.h.detach() * x\n"


def test_an_expression_is_matched_as_python_reads_it_whatever_its_quotes():
    # the target comes from a runtime name (`state['h']`); the source may spell it `state["h"]`
    assert edit('state["h"] = rnn(x, state["h"])\n', "detach_argument", 1, "state['h']", call="rnn") == (
        'state["h"] = rnn(x, state["h"].detach())\n')
    assert edit("y = f(( a ))\n", "clone_argument", 1, "a", call="f") == "y = f(( a ).clone())\n"


def test_a_write_through_out_is_made_an_assignment_or_a_copy_under_no_grad():
    assert edit("torch.mul(y, 2.0, out=y)\n", "inplace_to_out_of_place", 1) == "y = torch.mul(y, 2.0)\n"
    assert edit("z = torch.cat(xs, out=buf)\n", "inplace_to_out_of_place", 1) == "z = buf = torch.cat(xs)\n"
    assert edit("torch.arange(n, out=self.w)\n", "wrap_no_grad", 1, out="copy") == (
        "with torch.no_grad():\n    self.w.copy_(torch.arange(n))\n")
    # inside a chain: copy_ returns the tensor it wrote, as out= does
    assert edit("torch.arange(n, out=w).mul_(pi)\n", "wrap_no_grad", 1, out="copy") == (
        "with torch.no_grad():\n    w.copy_(torch.arange(n)).mul_(pi)\n")
    with pytest.raises(EditNotApplicable, match="no `out=` argument"):
        edit("w.mul_(pi)\n", "wrap_no_grad", 1, out="copy")


def test_run_unconditionally_replaces_the_if_by_its_body():
    source = ("def forward(self, x):\n    # cache\n    if self.cache is None:\n        # made once\n"
              "        self.cache = self.proj(self.anchor)\n    return x @ self.cache\n")
    assert edit(source, "run_unconditionally", 3, "self.cache", test="self.cache is None") == (
        "def forward(self, x):\n    # cache\n    # made once\n    self.cache = self.proj(self.anchor)\n"
        "    return x @ self.cache\n")
    with pytest.raises(EditNotApplicable, match="tests `self.cache is None`, not `self.other is None`"):
        edit(source, "run_unconditionally", 3, "self.cache", test="self.other is None")
    with pytest.raises(EditNotApplicable, match="no `if` without an else"):
        edit("if a:\n    b = 1\nelse:\n    b = 2\n", "run_unconditionally", 1, "b")


def test_replace_expression_replaces_the_target_inside_the_statement():
    assert edit("scaler.scale(total).backward()  # step\n", "replace_expression", 1, "total", **{"with": "loss"}) == (
        "scaler.scale(loss).backward()  # step\n")
    with pytest.raises(EditNotApplicable, match="`other` not found"):
        edit("total.backward()\n", "replace_expression", 1, "other", **{"with": "loss"})
