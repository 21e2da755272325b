"""What differs between the torch releases gradguard supports (pyproject: torch>=2.4,<2.16), in one place.

# NOTE [torch 2.4: saved tensors cannot be read back without unpacking]
# From torch 2.5 ``SavedTensor.data`` returns what the pack hook returned, so a graph node's saved arguments
# can be matched to gradguard's records without unpacking (``graph.iter_saved``). torch 2.4's SavedTensor
# has only ``register_hooks``: the record is found by reading ``node._saved_<name>`` once, which calls the
# unpack hook; while ``probe_attribute`` runs, the session's unpack hands back the tensor unchecked and notes
# which record it was given.
#
# NOTE [torch 2.4: the user's saved-tensor hooks cannot be listed]
# ``torch._C._autograd._top_saved_tensors_default_hooks`` (torch >= 2.5) lets a guard entered inside the user's
# hooks call them from its own. torch 2.4 has no way to get them back, only to know that some are active
# (disabling saved-tensor hooks raises while any are on the stack). A guard entered inside the user's hooks on
# torch 2.4 therefore steps aside for saved tensors (one NotWatched line) instead of replacing the user's
# hooks, which would change the gradients.
#
# NOTE [torch 2.4: Dynamo traces saved-tensor hooks]
# From torch 2.5 Dynamo switches saved-tensor hooks off while it traces; torch 2.4 traces into them, and
# tracing the guard's pack hook fails inside Dynamo (an assertion in symbolic_convert). On torch 2.4 the pack
# hook returns the tensor untouched while ``torch.compiler.is_compiling()`` (True only during tracing).
#
# NOTE [torch 2.14: Function.apply is a C method]
# ``torch.autograd.Function.apply`` became a ``classmethod_descriptor``; _attribution wraps it through its
# descriptor protocol (works on every version).
"""

from __future__ import annotations

import threading

import torch

__all__ = ["GATE_CALLS", "TOP_HOOKS", "SAVED_TENSOR_DATA", "DYNAMO_TRACES_HOOKS", "saved_tensors_hooks_active",
           "probe_attribute", "probing_unpack"]

TOP_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)  # torch >= 2.5
SAVED_TENSOR_DATA = hasattr(torch._C._autograd.SavedTensor, "data")  # torch >= 2.5
DYNAMO_TRACES_HOOKS = tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 5)
# The write log's call gate (call_gate.py) is a TorchFunctionMode; Dynamo traces such modes from torch 2.5.
# On torch 2.4 the write log keeps its op stream on for the whole guard.
GATE_CALLS = not DYNAMO_TRACES_HOOKS


def saved_tensors_hooks_active() -> bool:
    """Whether any saved-tensor hooks are active on this thread (any torch version)."""
    autograd = torch._C._autograd
    if TOP_HOOKS is not None:
        return TOP_HOOKS(False) is not None
    previous = autograd._saved_tensors_hooks_get_disabled_error_message()
    try:
        autograd._saved_tensors_hooks_disable("gradguard: probing for active saved-tensor hooks")
    except RuntimeError:
        return True
    finally:
        if previous is None:
            autograd._saved_tensors_hooks_enable()
        else:
            autograd._saved_tensors_hooks_disable(previous)
    return False


_probe = threading.local()


def probing_unpack(record) -> bool:
    """Called first by the session's unpack hooks: True while ``probe_attribute`` reads a node (record noted)."""
    seen = getattr(_probe, "seen", None)
    if seen is None:
        return False
    seen.append(record)
    return True


def probe_attribute(obj, attribute: str) -> list:
    """The pack hook's return values for the saved tensors that reading ``obj.<attribute>`` unpacks (torch 2.4:
    a graph node's ``_saved_x``, a custom Function's ``saved_tensors``)."""
    _probe.seen = []
    try:
        getattr(obj, attribute)
    finally:
        seen, _probe.seen = _probe.seen, None
    return seen
