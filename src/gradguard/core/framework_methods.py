"""Which out-of-place method or function the loaded frameworks have for an in-place one (``div_`` -> ``div``).

Its own module because both sides of a fix ask it: the suggestion text (core.fixes.out_of_place) and the libcst
edit that text is made from (core.edits). Neither imports the other for it, so the two stay one import
direction: _fixes -> _edits -> here.
"""

from __future__ import annotations

__all__ = ["out_of_place_method"]

# NOTE [Out-of-place methods come from the framework]
# `x.div_(n)` becomes `x = x.div(n)` only when the tensor type has a method `div`: the table is the framework
# itself, not a list kept here. `normal_`, `uniform_`, `zero_`, `fill_`, `copy_` have no out-of-place method, so
# the repair for them writes into a clone instead (`x = x.clone()` first). `bernoulli_(p)` has a namesake with
# another meaning (`x.bernoulli()` draws with x as the probabilities), so it is treated as having none.
_OTHER_MEANING = {"bernoulli_"}


def _framework_types() -> list[tuple[object, object]]:
    """(module, tensor type) of each framework loaded in this process. core imports none: ``gradguard fix`` loads
    the script's framework before it edits (fix/_verify.load_frameworks)."""
    import sys

    return [(sys.modules[m], getattr(sys.modules[m], "Tensor", None)) for m in ("torch", "paddle", "mindspore")
            if m in sys.modules]


def out_of_place_method(name: str, namespace: bool = False) -> str | None:
    """``div_`` -> ``div``; None when the framework has no out-of-place method of that name (``normal_``).
    ``namespace``: look for a function of the module (``torch.relu`` for ``torch.relu_``) instead."""
    if not name.endswith("_") or name.endswith("__") or name in _OTHER_MEANING:
        return None
    base = name[:-1]
    frameworks = _framework_types()
    if not frameworks:
        return base  # no framework to ask: trust the naming convention
    if any(callable(getattr(module if namespace else tensor, base, None)) for module, tensor in frameworks):
        return base
    return None
