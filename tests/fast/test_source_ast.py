"""Reading the user's source to name what an exception does not name."""

from __future__ import annotations

import textwrap

from gradguard.core._source_ast import assignment_before, written_expression


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
    from gradguard.core._source_ast import call_name

    assert call_name("z = ops.sin(net.w * x)", operand="net.w") == "multiply"
    assert call_name("z = ops.sin(net.w * x)") == "sin"
    assert call_name("z = ops.matmul(x, weight=net.w)", operand="net.w") == "matmul"
    assert call_name("z = x * y") == "multiply"
    assert call_name("z = f(g(x))") is None
    assert call_name("z = f(g(x))", operand="missing") is None
