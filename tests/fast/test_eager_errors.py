"""PyTorch's eager errors (raised at the write, or at a second backward) come out of the guard as
gradguard errors naming the tensor, the line that made it a leaf/view, and a fix written against the
user's line. The user's own unrelated errors pass through untouched."""

from __future__ import annotations

import pytest
import torch

import gradguard


def _raised(error_type, body):
    with pytest.raises(error_type) as info:
        with gradguard.guard():
            body()
    return info.value


def test_leaf_update_outside_no_grad():
    w = torch.randn(3, requires_grad=True)
    (w * w).sum().backward()

    def step():
        nonlocal w
        w -= 0.1 * w.grad

    error = _raised(gradguard.InplaceModificationError, step)
    finding = error.finding
    assert isinstance(error, RuntimeError)
    assert isinstance(error.__cause__, RuntimeError) and "leaf Variable" in str(error.__cause__)
    assert finding.kind == "leaf_inplace" and finding.rule == "leaf_inplace"
    assert finding.tensor.name == "w" and finding.tensor.shape == (3,)
    assert finding.modified_at[0].location.code == "w -= 0.1 * w.grad"
    assert "`with torch.no_grad(): w -= 0.1 * w.grad`" in finding.suggestion
    assert "w = torch.randn(3, requires_grad=True)" in str(error)  # the line that made it a leaf


def test_leaf_computation_gets_out_of_place_rewrite():
    x = torch.ones(2, requires_grad=True)

    def compute():
        x.add_(1)

    finding = _raised(gradguard.InplaceModificationError, compute).finding
    assert finding.rule == "leaf_inplace"
    assert "`x = x.add(1)`" in finding.suggestion


def test_view_of_a_parameter_names_it_by_the_users_expression():
    embedding = torch.nn.Embedding(5, 2)

    def zero_row():
        embedding.weight[0] = 0

    finding = _raised(gradguard.InplaceModificationError, zero_row).finding
    assert finding.rule == "view_of_leaf_inplace"
    assert finding.tensor.name == "embedding.weight" and finding.tensor.role == "parameter"
    assert "`with torch.no_grad(): embedding.weight[0] = 0`" in finding.suggestion
    assert "padding_idx=0" in finding.suggestion


def test_multi_output_view_from_unbind():
    pair = torch.randn(2, 3, requires_grad=True) * 1.0
    a, b = pair.unbind(0)

    def double():
        a.mul_(2)

    finding = _raised(gradguard.InplaceModificationError, double).finding
    assert finding.kind == "view_inplace" and finding.rule == "multi_output_view_inplace"
    assert finding.tensor.name == "a"
    assert "unbind()" in finding.explanation
    assert "a, b = pair.unbind(0)" in finding.explanation
    assert "`a = a.mul(2)` instead of `a.mul_(2)`" in finding.suggestion


def test_multi_output_view_written_through_its_tuple_in_a_comprehension():
    def squeeze_all(hidden):
        hx = (hidden
              .reshape(2, 1, 3)
              .unbind(0))
        return [hx[idx].squeeze_(0) for idx in range(2)]

    finding = _raised(gradguard.InplaceModificationError,
                      lambda: squeeze_all(torch.randn(6, requires_grad=True) * 1.0)).finding
    assert finding.rule == "multi_output_view_inplace"
    assert finding.tensor.name == "hx[idx]" and finding.tensor.shape == (1, 3)  # the piece, not the tuple `hx`
    assert "(line 80: `hx = hidden.reshape(2, 1, 3).unbind(0)`)" in finding.explanation  # the whole statement
    assert ("`return [hx[idx].squeeze(0) for idx in range(2)]` instead of `return [hx[idx].squeeze_(0) for idx "
            "in range(2)]`") in finding.suggestion
    assert "clone()" not in finding.suggestion  # `hx[idx] = hx[idx].clone()` would write into a tuple
    assert [i.action for i in finding.fixes] == ["inplace_to_out_of_place"]


def test_multi_output_view_bound_by_a_loop_is_not_told_to_rebind():
    # corpus 006 (Score-CAM's denormalize): `channel = channel.mul(std)` would drop the write the loop makes
    image = torch.randn(1, 3, 2, 2, requires_grad=True).clone()

    def denormalize():
        for channel, std in zip(image[0], [0.2, 0.3, 0.4]):
            channel.mul_(std)

    finding = _raised(gradguard.InplaceModificationError, denormalize).finding
    assert finding.rule == "multi_output_view_inplace"
    assert finding.suggestion.startswith("`channel` is the variable of a for loop over a tensor")
    assert "channel = channel.mul(std)" not in finding.suggestion
    # the edit gradguard fix applies: the loop hands out indexed views, which can be written in place
    (intent,) = finding.fixes
    # (`i` is a name already used in this file, so the index gets the next free name)
    assert (intent.action, intent.target, intent.detail, intent.preferred) == ("index_loop_variable", "channel", {"index": "index"}, True)


def test_multi_output_view_from_chunk():
    q, k = (torch.randn(2, 4, requires_grad=True) * 1.0).chunk(2, dim=-1)

    def scale():
        nonlocal q
        q *= 0.5

    finding = _raised(gradguard.InplaceModificationError, scale).finding
    assert "chunk()/split()" in finding.explanation
    assert "`q = q * 0.5` instead of `q *= 0.5`" in finding.suggestion


def test_multi_output_view_written_inside_an_inplace_module_is_named_from_the_callers_line():
    relu = torch.nn.ReLU(inplace=True)  # the write happens inside the module, not on the caller's line
    out = torch.randn(2, 6, requires_grad=True) * 1.0

    def block():
        dist, remain = torch.split(out, (2, 4), dim=1)
        relu(remain)

    finding = _raised(gradguard.InplaceModificationError, block).finding
    assert finding.tensor.name == "remain"
    assert "`remain` is one of several views returned together by split()" in finding.explanation
    assert "`remain = remain.clone()`" in finding.suggestion



def test_a_write_refused_inside_a_nested_inplace_module_names_that_instance_by_its_path():
    # the write is in torch's ReLU, two modules below the caller's line: the finding names the instance, which is
    # what the repair search needs to find the construction to set inplace=False
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Sequential(torch.nn.Tanh(), torch.nn.ReLU(inplace=True)))
    net[0].register_full_backward_hook(lambda module, grad_input, grad_output: None)
    net[1][0].register_full_backward_hook(lambda module, grad_input, grad_output: None)
    x = torch.randn(2, 3)

    def forward():
        net(x)

    finding = _raised(gradguard.InplaceModificationError, forward).finding
    write = finding.modified_at[0]
    assert write.via == "net.1.1 (ReLU(inplace=True))"
    assert write.category == "activation"
    assert write.location.code == "net(x)"
    assert (finding.tensor.shape, finding.tensor.dtype) == ((2, 3), "float32")  # what the ReLU was called on
    assert finding.explanation == (
        "`net.1.1` (ReLU) wrote in place into the output of the autograd Function BackwardHookFunction; autograd "
        "cannot rebase the Function's backward on an in-place write into its output.")
    assert finding.suggestion == (
        "Construct `net.1.1` (ReLU) with inplace=False, so that it returns a new tensor. A module's full backward "
        "hook (register_full_backward_hook) hands on its output through BackwardHookFunction, whose output cannot "
        "be written in place.")



def test_a_chunk_piece_written_by_a_nested_inplace_module_is_told_to_change_that_module():
    gate = torch.nn.Sequential(torch.nn.SiLU(inplace=True))
    h = torch.randn(2, 6, requires_grad=True) * 1.0

    def forward():
        a, b = h.chunk(2, dim=1)
        gate(a)

    finding = _raised(gradguard.InplaceModificationError, forward).finding
    assert finding.modified_at[0].via == "gate.0 (SiLU(inplace=True))"
    assert finding.suggestion == ("`gate.0` (SiLU) wrote it in place: construct it with inplace=False. Or clone "
                                  "the piece first (`a = a.clone()`).")

def test_a_write_into_a_loops_variable_over_pieces_held_by_name_is_told_to_copy_them_before_the_loop():
    parts = (torch.randn(4, 3, requires_grad=True) * 1.0).split(2, dim=0)

    def halve():
        for p in parts:
            p.mul_(0.5)

    finding = _raised(gradguard.InplaceModificationError, halve).finding
    assert finding.suggestion == (
        "`p` is the variable of a for loop over `parts`, whose items are views returned together by "
        "chunk()/split(): rebinding `p` (out of place, or to a clone) would drop the write. Copy the items before "
        "the loop (`parts = [p.clone() for p in parts]`), so that the loop writes copies, which the code then "
        "reads.")
    (intent,) = finding.fixes  # the edit is the one the text gives
    assert (intent.action, intent.target, intent.detail["code"]) == (
        "insert_before", "parts", "parts = [p.clone() for p in parts]")

def test_view_created_under_no_grad():
    hidden = torch.randn(3, 4, requires_grad=True) * 1.0
    with torch.no_grad():
        first = hidden[:, :2]

    def clamp():
        first.clamp_(min=0)

    finding = _raised(gradguard.InplaceModificationError, clamp).finding
    assert finding.rule == "no_grad_view_inplace"
    assert finding.tensor.name == "first"
    assert "`first = hidden[:, :2].clone()`" in finding.suggestion
    assert "move `first.clamp_(min=0)` into the same `with torch.no_grad():` block" in finding.suggestion


def test_view_created_under_no_grad_read_after_its_base_was_written():
    w = torch.randn(3, 4, requires_grad=True)

    def snapshot_then_update():
        x = w * 2
        with torch.no_grad():
            first = x[0]
        x.mul_(3)
        return (first * w[0]).sum()

    finding = _raised(gradguard.InplaceModificationError, snapshot_then_update).finding
    assert finding.kind == "view_inplace" and finding.rule == "no_grad_view_inplace"
    assert finding.tensor.name == "first" and finding.tensor.role == "view" and finding.tensor.shape == (4,)
    assert "that tensor was written in place since, with grad mode on, and `return (first * w[0]).sum()` uses " \
        "`first`" in finding.explanation
    assert finding.suggestion.startswith("If `first` is meant as a separate value, make it a copy: "
                                         "`first = x[0].clone()`")
    assert [(x.action, x.target) for x in finding.fixes] == [("clone_assignment", "first")]


def test_backward_twice_through_carried_state_names_the_state():
    cell = torch.nn.RNNCell(2, 3)
    inputs = torch.randn(3, 1, 2)

    def train():
        h = torch.zeros(1, 3)
        for x in inputs:
            h = cell(x, h)
            loss = h.sum()
            loss.backward()

    error = _raised(gradguard.BackwardTwiceError, train)
    finding = error.finding
    assert finding.kind == "backward_twice" and finding.rule == "carried_state_backward_twice"
    assert finding.tensor.name == "h" and finding.tensor.shape == (1, 3)
    # detached where the assignment reads the previous step's h: `h = h.detach()` after it would cut this step's
    # gradient from `loss = h.sum()`
    assert "`h = cell(x, h.detach())` (line" in finding.suggestion
    assert "Trying to backward through the graph a second time" in finding.facts.torch_message
    assert "freed by" in str(error)


def test_backward_twice_of_one_loss_on_two_lines_deletes_the_second():
    x = torch.randn(3, requires_grad=True)

    def twice():
        y = (x * x).sum()
        y.backward()
        y.backward()

    finding = _raised(gradguard.BackwardTwiceError, twice).finding
    assert finding.rule == "same_loss_backward_twice"
    assert "retain_graph=True would only hide it" in finding.suggestion
    assert [(i.action, i.target) for i in finding.fixes] == [("remove_statement", "y.backward()")]


def test_users_own_errors_pass_through_unchanged():
    mine = ValueError("my own bug")

    def fail():
        raise mine

    assert _raised(ValueError, fail) is mine

    other = RuntimeError("shape mismatch in my code")

    def fail_runtime():
        raise other

    assert _raised(RuntimeError, fail_runtime) is other


def _backward_twice_of_script(script, code: str):
    """The BackwardTwiceError info of running ``code`` as the file ``script`` under the guard."""
    script.write_text(code)
    with pytest.raises(gradguard.BackwardTwiceError) as info:
        with gradguard.guard():
            exec(compile(code, str(script), "exec"), {})
    return info


ACCUMULATED = '''\
import torch

w = torch.ones(3, requires_grad=True)
loss = 0
for t in range(2):
    loss += (w * t).exp().sum()
loss.backward()
for t in range(2):
    loss += (w * t).exp().sum()
loss.backward()
'''


def test_a_loss_accumulated_across_a_backward_without_a_reset(tmp_path):
    # corpus 061 (SAM's two passes): the fix is resetting the accumulator, not detaching a carried state
    info = _backward_twice_of_script(tmp_path / "accumulate.py", ACCUMULATED)
    finding = info.value.finding
    assert finding.rule == "accumulated_loss_not_reset"
    assert finding.tensor.name == "loss"
    assert (finding.saved_at.location.line, finding.saved_at.location.code) == (6, "loss += (w * t).exp().sum()")
    assert finding.suggestion == ("Reset the accumulator before accumulating again: insert `loss = 0` before line 8, "
                                  "so each backward covers only its own losses.")
    assert [(i.action, i.line, i.detail) for i in finding.fixes] == [("insert_before", 8, {"code": "loss = 0"})]
    assert "saved by    : the forward call at" in str(info.value)


SAME_LOSS_TWICE = '''\
import torch

model = torch.nn.Linear(3, 1)


def criterion(x):
    loss = model(x).tanh().sum()
    loss.backward()
    return loss


loss = criterion(torch.randn(4, 3))
loss.backward()
'''


def test_the_same_loss_backpropagated_by_a_helper_and_by_its_caller(tmp_path):
    # corpus 054 (R-Drop: the criterion and the task both call optimizer.backward(loss)): nothing crosses between
    # graphs; the repair deletes the second call, where the two call paths part
    finding = _backward_twice_of_script(tmp_path / "same_loss.py", SAME_LOSS_TWICE).value.finding
    assert finding.rule == "same_loss_backward_twice"
    assert finding.tensor.name == "loss"
    assert finding.facts.display[:2] == [
        ("freed by", "the backward of the same `loss` at line 8 (called from line 12): loss.backward()"),
        ("again", "at line 13: loss.backward()")]
    assert finding.explanation == (
        "The same `loss` is backpropagated twice: `loss.backward()` at line 8 (called from line 12) already ran its "
        "backward, which freed the saved tensors of its graph, and `loss.backward()` at line 13 backpropagates it "
        "again.")
    assert finding.suggestion == (
        "Backpropagate each loss once: delete `loss.backward()` at line 13; the call at line 8 already computed its "
        "gradients. retain_graph=True would only hide it: the second backward would add the same gradients again.")
    assert [(i.action, i.line, i.target) for i in finding.fixes] == [("remove_statement", 13, "loss.backward()")]


def test_the_same_loss_backpropagated_twice_in_one_line_of_a_loop_is_not_this_case(tmp_path):
    # the same path both times (a forward made before the loop): no call to delete
    code = "import torch\nw = torch.ones(2, requires_grad=True)\nloss = (w * w).sum()\nfor _ in range(2):\n    loss.backward()\n"
    assert _backward_twice_of_script(tmp_path / "loop.py", code).value.finding.rule == "forward_outside_loop"


FREED_PART = '''\
import torch

w = torch.ones(3, requires_grad=True)
features = (w * 2).exp()
features.sum().backward()
total = (features * 3).sum()
total.backward()
'''


def test_backward_twice_names_the_forward_line_of_the_freed_part(tmp_path):
    # corpus 016 and 056: the node whose saved tensors the earlier backward freed, and the line that made it
    finding = _backward_twice_of_script(tmp_path / "freed.py", FREED_PART).value.finding
    assert (finding.saved_at.node, finding.saved_at.location.line) == ("ExpBackward0", 4)
    assert finding.saved_at.location.code == "features = (w * 2).exp()"


def test_backward_twice_before_the_guard_names_no_forward_line(tmp_path):
    script = tmp_path / "outside.py"
    script.write_text(FREED_PART)
    namespace = {}
    code = FREED_PART.replace("total = ", "with guard:\n    total = ").replace("\ntotal.backward()", "\n    total.backward()")
    namespace["guard"] = gradguard.guard()
    with pytest.raises(gradguard.BackwardTwiceError) as info:
        exec(compile(code, str(script), "exec"), namespace)
    assert info.value.finding.saved_at.location is None  # the earlier backward ran before the guard: not known


def test_leaf_written_through_getattr_is_named_by_the_attribute_it_reaches():
    # the receiver is written, not the argument: `getattr(module, name).copy_(data)` writes module.weight
    layer = torch.nn.Linear(3, 3)

    def update(module, name, data):
        getattr(module, name).copy_(data)

    finding = _raised(gradguard.InplaceModificationError,
                      lambda: update(layer, "weight", torch.zeros(3, 3))).finding
    assert finding.rule == "leaf_inplace"
    assert finding.tensor.name == "module.weight" and finding.tensor.role == "parameter"
    assert "`with torch.no_grad(): getattr(module, name).copy_(data)`" in finding.suggestion


def test_a_write_through_out_while_autograd_records_is_assigned_instead():
    a = torch.randn(4, 3, requires_grad=True)

    def scale():
        y = torch.sigmoid(a)
        torch.mul(y, 2.0, out=y)

    finding = _raised(gradguard.InplaceModificationError, scale).finding
    assert finding.kind == "out_argument" and finding.rule == "out_argument_with_grad"
    assert finding.tensor.name == "y"
    assert finding.suggestion == ("Assign the result instead of writing it into `y`: `y = torch.mul(y, 2.0)` (a new "
                                  "tensor, which autograd records).")
    line = finding.modified_at[0].location.line
    assert [(x.action, x.line) for x in finding.fixes] == [("inplace_to_out_of_place", line)]


def test_a_parameter_filled_through_out_is_filled_by_copy_under_no_grad():
    class Bessel(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.freq = torch.nn.Parameter(torch.empty(n))
            torch.linspace(1.0, 3.0, n, out=self.freq)

    finding = _raised(gradguard.InplaceModificationError, lambda: Bessel(4)).finding
    assert finding.kind == "leaf_inplace" and finding.rule == "out_argument_with_grad"
    assert finding.tensor.name == "self.freq" and finding.tensor.role == "parameter"
    assert "`with torch.no_grad(): self.freq.copy_(torch.linspace(1.0, 3.0, n))`" in finding.suggestion
    assert [(x.action, x.detail) for x in finding.fixes] == [("wrap_no_grad", {"out": "copy"})]


def test_a_view_detached_in_place_is_detached_out_of_place():
    lstm = torch.nn.LSTM(3, 4, batch_first=True)

    def stop_gradient():
        out, _ = lstm(torch.randn(2, 6, 3))
        last = out[:, -1]
        last.detach_()

    finding = _raised(gradguard.InplaceModificationError, stop_gradient).finding
    assert finding.kind == "view_inplace" and finding.rule == "detach_view_inplace"
    assert finding.tensor.name == "last"
    assert finding.suggestion.startswith("Make a detached tensor instead: `last = last.detach()`")
    assert [x.action for x in finding.fixes] == ["inplace_to_out_of_place"]


@pytest.mark.parametrize("switch", ["target.requires_grad_(False)", "target.requires_grad = False"])
def test_autograd_switched_off_on_a_computed_tensor_becomes_a_detached_tensor(switch, tmp_path):
    script = tmp_path / "distill.py"  # the line is read from the file that raised
    script.write_text(f"target = teacher(torch.randn(8, 4))\n{switch}\n")
    scope = {"teacher": torch.nn.Linear(4, 4), "torch": torch}

    finding = _raised(gradguard.InplaceModificationError,
                      lambda: exec(compile(script.read_text(), str(script), "exec"), scope)).finding
    assert finding.kind == "requires_grad_flag" and finding.rule == "requires_grad_of_non_leaf"
    assert finding.tensor.name == "target"
    assert "`target = target.detach()`" in finding.suggestion


def test_autograd_switched_on_on_a_computed_tensor_keeps_its_gradient_instead(tmp_path):
    script = tmp_path / "fgm.py"  # adversarial training on embeddings: the gradient of the embedding output
    script.write_text("embeds = emb(ids)\nembeds.requires_grad = True\n")
    scope = {"emb": torch.nn.Embedding(10, 4), "ids": torch.tensor([[1, 2]])}

    finding = _raised(gradguard.InplaceModificationError,
                      lambda: exec(compile(script.read_text(), str(script), "exec"), scope)).finding
    assert finding.kind == "requires_grad_flag" and finding.rule == "requires_grad_of_non_leaf"
    assert "it requires grad already" in finding.explanation and "switches autograd off" not in finding.explanation
    assert finding.suggestion == ("To read `embeds.grad` after backward, ask autograd to keep it: "
                                  "`embeds.retain_grad()`.")
    assert [x.action for x in finding.fixes] == ["inplace_to_out_of_place"]
