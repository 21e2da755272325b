"""Reading the user's source to name what an exception does not name."""

from __future__ import annotations

import textwrap

import pytest

from gradguard.core.source_ast import assignment_before, written_expression


def _file(tmp_path, body: str) -> str:
    path = tmp_path / "user.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_assignment_before_ignores_attribute_and_item_writes_and_augmented_assignment(tmp_path):
    path = _file(
        tmp_path,
        """
        w = make()
        w.grad = g
        w[0] = 1
        w -= 1
        w.add_(1)
        """,
    )
    found = assignment_before(path, 6, "w")
    assert (found.line, found.code) == (2, "w = make()")
    assert assignment_before(path, 6, "w.grad").line == 3


def test_assignment_before_sees_tuple_unpacking_and_loops(tmp_path):
    path = _file(
        tmp_path,
        """
        a, (b, *rest) = x.unbind(0), y
        for h in hs:
            pass
        a.mul_(2)
        """,
    )
    assert assignment_before(path, 5, "a").line == 2
    assert assignment_before(path, 5, "rest").line == 2
    assert assignment_before(path, 5, "h").line == 3
    assert assignment_before(path, 5, "missing") is None


def test_written_expression(tmp_path):
    path = _file(
        tmp_path,
        """
        w += 1
        x[0, 1] = 2
        model.fc.weight.add_(1)
        torch.relu_(h)
        y = f(x)
        """,
    )
    assert [written_expression(path, line) for line in range(2, 7)] == ["w", "x", "model.fc.weight", "h", None]


def test_call_name_names_the_op_that_takes_the_operand():
    from gradguard.core.source_ast import call_name

    assert call_name("z = ops.sin(net.w * x)", operand="net.w") == "multiply"
    assert call_name("z = ops.sin(net.w * x)") == "sin"
    assert call_name("z = ops.matmul(x, weight=net.w)", operand="net.w") == "matmul"
    assert call_name("z = x * y") == "multiply"
    assert call_name("z = f(g(x))") is None
    assert call_name("z = f(g(x))", operand="missing") is None


def test_written_expression_of_chains_inplace_keywords_and_indexed_modules(tmp_path):
    path = _file(
        tmp_path,
        """
        channel.mul_(std).add_(mean)
        x = F.relu(x, inplace=True)
        model.layer[i].dense.weight[:, pos] -= delta
        rows[mask.nonzero()].add_(1)
        """,
    )
    # corpus cases 006 (scorecam), 023 (functional relu) and 011 (knowledge neurons) named `mean` or nothing
    assert written_expression(path, 2) == "channel"
    assert written_expression(path, 3) == "x"
    assert written_expression(path, 4) == "model.layer[i].dense.weight"
    assert written_expression(path, 5) is None  # an index that would run code is not a plain reference


def test_evaluate_reference_runs_no_user_code():
    import torch

    from gradguard.core.source_ast import evaluate_reference

    class Box:
        calls = 0

        def __getitem__(self, index):
            Box.calls += 1
            return index

    layers = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)])
    scope = {"model": torch.nn.Module(), "layers": layers, "i": 1, "box": Box(), "pairs": {"a": (1, 2)}}
    assert evaluate_reference("layers[i].weight", scope) is layers[1].weight
    assert evaluate_reference("layers[0].bias", scope) is layers[0].bias
    assert evaluate_reference("pairs['a'][1]", scope) == 2
    assert evaluate_reference("box[3]", scope) is None and Box.calls == 0
    assert evaluate_reference("missing.weight", scope) is None
    assert evaluate_reference("layers[i](x)", scope) is None


def test_written_reference_keeps_the_index_steps_and_the_frame_resolves_them(tmp_path):
    import torch

    from gradguard.core.source_ast import reference_prefixes, written_reference

    path = _file(
        tmp_path,
        """
        U.blocks[(c0, c1)] *= s
        cache['k'].add_(1)
        x[i, 0] = 1
        rows[f(i)] += 1
        """,
    )
    assert [written_reference(path, line) for line in range(2, 6)] == [
        "U.blocks[c0, c1]", "cache['k']", "x", "rows"]  # an index that would run code: the part of `rows` it writes
    assert written_expression(path, 2) == "U.blocks"  # without a frame, the index is dropped

    class Factors:
        blocks = {(0, 1): torch.zeros(2), (1, 1): torch.ones(2)}

    scope = {"U": Factors(), "c0": 0, "c1": 1}
    assert [text for text, _ in reference_prefixes("U.blocks[(c0, c1)]", scope)] == [
        "U", "U.blocks", "U.blocks[(c0, c1)]"]
    assert list(reference_prefixes("U.blocks[(c0, c1)]", scope))[-1][1] is Factors.blocks[(0, 1)]
    # a tuple index on a tensor stops the walk: a tensor is no container, its indices are parts of it
    assert [text for text, _ in reference_prefixes("t[(c0, c1)]", {"t": torch.zeros(2, 2), "c0": 0, "c1": 1})] == [
        "t"]


def test_out_of_place_never_assigns_to_a_call():
    from gradguard.core.fixes import out_of_place

    assert out_of_place("channel.mul_(std).add_(mean)") == "channel = channel.mul(std).add(mean)"
    assert out_of_place("x = F.relu(x, inplace=True)") == "x = F.relu(x)"
    assert out_of_place("net(x).relu_()") is None


@pytest.mark.parametrize("code, receiver", [
    ("errG.backward()", "errG"),
    ("self.loss.backward(retain_graph=True)", "self.loss"),
    ("torch.autograd.backward(loss)", "loss"),
    ("opt.zero_grad(); loss.backward()", "loss"),
    ("(loss_a + loss_b).backward()", None),  # no name to compare or look up
    ("scaler.scale(acc_loss).backward()", "acc_loss"),  # a scaling of the loss: the loss
    ("hv = torch.autograd.grad(grads, params, grad_outputs=v)", "grads"),  # what autograd.grad backpropagates
    ("g = autograd.grad(outputs=y, inputs=x)", "y"),
    ("loss.mean().backward()", "loss"),  # a reduction of the loss: the loss
    ("self.critic(x).sum().backward()", None),  # a module's output: no name
    ("loss.item()", None),
])
def test_backward_receiver(code, receiver):
    from gradguard.core.source_ast import backward_receiver

    assert backward_receiver(code) == receiver


def test_written_expression_is_the_receiver_never_an_argument(tmp_path):
    path = _file(
        tmp_path,
        """
        getattr(module, name).copy_(data)
        make_buffer().add_(delta)
        torch.nn.init.zeros_(layer.bias)
        getattr(module, "weight").mul_(scale)
        """,
    )
    # the receiver is what a method writes: `data` and `delta` are only read (corpus case 103 named `data`)
    assert written_expression(path, 2) is None
    assert written_expression(path, 3) is None
    assert written_expression(path, 4) == "layer.bias"  # a namespace's function writes its first argument
    # where the writing frame is at hand, a getattr receiver is kept, to be resolved there
    assert written_expression(path, 2, dynamic=True) == "getattr(module, name)"
    assert written_expression(path, 5, dynamic=True) == "getattr(module, 'weight')"
    assert written_expression(path, 3, dynamic=True) is None


def test_getattr_steps_evaluate_and_read_as_the_attribute_they_reach():
    import torch

    from gradguard.core.source_ast import dotted_reference, evaluate_reference

    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    scope = {"module": net[0], "name": "weight", "net": net, "i": 0, "number": 3}
    assert evaluate_reference("getattr(module, name)", scope) is net[0].weight
    assert evaluate_reference("getattr(net[i], 'bias')", scope) is net[0].bias
    assert evaluate_reference("getattr(module, number)", scope) is None  # not an attribute name
    assert dotted_reference("getattr(module, name)", scope) == "module.weight"
    assert dotted_reference("getattr(net[i], 'bias').data", scope) == "net[i].bias.data"
    assert dotted_reference("getattr(module, number)", scope) is None


def test_a_write_through_out_and_an_items_own_assignment(tmp_path):
    path = _file(
        tmp_path,
        """
        state = {"h": h0}
        state["h"] = rnn(x, state["h"])
        torch.cat(parts, dim=0, out=buf)
        torch.arange(1, n + 1, out=self.freq).mul_(pi)
        """,
    )
    assert written_expression(path, 4) == "buf"
    assert written_expression(path, 5) == "self.freq"  # the in-place method writes what out= filled
    assert assignment_before(path, 4, "state['h']").line == 3  # the item's own assignment, quotes as Python reads
    assert assignment_before(path, 4, "state").line == 2
