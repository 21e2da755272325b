"""The loss a ``.backward()`` call runs on: the receiver's expression read from the user's line, and its value
read from the user's frame."""

from __future__ import annotations

import collections
import functools

from ...core.source_ast import evaluate_reference

__all__ = ["_backward_receiver", "_lookup"]


def _lookup(expression: str, frame) -> object:
    return evaluate_reference(expression, collections.ChainMap(frame.f_locals, frame.f_globals))  # no copy


@functools.lru_cache(maxsize=1024)  # recorded for every backward pass: the same few lines
def _backward_receiver(code: str) -> str | None:
    """``errG.backward()`` -> ``errG``; ``torch.autograd.backward(loss)`` -> ``loss``."""
    import ast

    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
            target = node.func.value if not (isinstance(node.func.value, ast.Attribute)
                                             and ast.unparse(node.func.value) == "torch.autograd") else (
                node.args[0] if node.args else None)
            if isinstance(target, (ast.Name, ast.Attribute)):
                return ast.unparse(target)
    return None
