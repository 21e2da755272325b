"""``check_op`` for Paddle: the one audit engine (``checks.audit``) with Paddle's answers to its questions.

# NOTE [Paddle in the audit engine]
# PyLayer subclasses and plain functions of tensors get the same checks as torch ops (float64 finite
# differences with random non-unit cotangents, the reference, cotangent linearity, precision, regimes,
# mutation, composition) and one Paddle-only check: ``mutation.saved_tensor_modified``, because Paddle does
# not version-check what a PyLayer saves with ``ctx.save_for_backward`` (a forward that changes a saved
# tensor afterwards, ``set_value`` or a kernel, gives silently wrong gradients). What Paddle cannot answer
# is skipped with the reason (``unsupported``): memory layout regimes and output/input aliasing.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import paddle

from ...checks.adapter_base import AdapterBase, OpRaised
from ...checks.report import CheckResult, Failure

__all__ = ["check_op", "PaddleCheckAdapter", "PADDLE"]


def _saved_tensor_modified(audit, base) -> tuple[list[Failure], list[CheckResult], list[str]]:
    """Forward under our own saved-tensor hooks, then backward: every saved tensor must be unpacked with the
    version and bytes it was packed with (NOTE [Paddle in the audit engine])."""
    from .session import _active

    check = "mutation.saved_tensor_modified"
    if _active:  # Paddle allows one pair of saved-tensor hooks, and a guard holds it
        return [], [CheckResult(check, "given", "skip", "a gradguard.guard() holds Paddle's saved-tensor hooks")], []
    B = audit.B
    saved: list[list] = []

    def pack(t):
        saved.append([t, B.version(t), B.fingerprint(t), None])
        return len(saved) - 1

    def unpack(index):
        entry = saved[index]
        entry[3] = (B.version(entry[0]), B.fingerprint(entry[0]))
        return entry[0]

    try:
        with paddle.autograd.saved_tensors_hooks(pack, unpack):
            lin = B.linearize(audit.fn, audit.args, audit.kwargs, audit.wrt)
        lin.pullback([np.asarray(u) for u in base.U[0]])
    except OpRaised as exc:  # already reported by the gradient suite, which ran the same calls
        return [], [CheckResult(check, "given", "skip", f"the op's {exc.phase} raised")], []
    found = []
    for i, (t, version, fp, seen) in enumerate(saved):
        if seen is None or seen == (version, fp):
            continue
        how = "its version moved" if seen[0] != version else "its values changed without a version bump"
        found.append(Failure(
            check=check, regime="given",
            message=f"saved tensor #{i} ({B.describe(t)}) changed between the forward that saved it and the backward "
                    f"that read it ({how}: version {version} -> {seen[0]})",
            why="Paddle does not check the tensors a PyLayer saves with ctx.save_for_backward: the backward computes "
                "its gradient from the new values, silently.",
            fix="save a tensor the forward no longer changes (save a clone, or change a copy with set_value / the "
                "in-place op instead of the saved tensor)."))
    return found, [CheckResult(check, "given", "fail" if found else "pass")], []


class PaddleCheckAdapter(AdapterBase):
    """The Paddle (dygraph) side of ``check_op``."""

    name = "paddle"
    tensor_type = paddle.Tensor
    no_grad_hint = "paddle.no_grad()"
    framework_checks = (_saved_tensor_modified,)
    phrasebook = {
        "mutation.silent_input_write": {
            "why": "Paddle's autograd cannot see this write (set_value, copy_, optimizer kernels and custom kernels "
                   "write without bumping inplace_version): any earlier op that saved this tensor for its backward "
                   "(exp, sigmoid, softmax, relu... save their outputs) now computes wrong gradients silently.",
            "fix": "write into a new tensor in the forward instead of into the input; if the in-place write is "
                   "intended, make it with a Paddle in-place op (x.add_(...)), which bumps inplace_version so Paddle "
                   "raises instead of computing wrong gradients.",
        },
    }
    message_phrases = (("mutation.backward_not_repeatable", "(retain_graph=True)",
                        "(paddle.grad(..., retain_graph=True))"),)
    unsupported = {
        "noncontiguous": "not run on Paddle: Paddle ops make their inputs contiguous before a kernel sees them",
        "channels_last": "not run on Paddle: Paddle tensors carry no channels_last memory format",
        "aliasing": "not checked on Paddle: a Paddle tensor does not say whether autograd tracks it as a view of "
                    "an input (reshape shares memory), so an alias cannot be told from a declared view",
    }

    @property
    def label(self) -> str:
        return f"paddle {paddle.__version__}"

    def requires_grad(self, t) -> bool:
        return not t.stop_gradient

    def to_numpy(self, t) -> np.ndarray:
        t = t.detach()
        dtype = {"float": "float64", "complex": None}.get(self.kind(t), "int64")
        return np.array(t.numpy() if dtype is None else t.astype(dtype).numpy(), copy=True)

    @staticmethod
    def tensor_from(arr: np.ndarray, dtype_name: str):
        return paddle.to_tensor(arr).astype(dtype_name)

    def detached(self, t):
        return t.detach()

    def to_float64(self, t):
        return t.detach().astype("float64")

    def clone(self, t):
        return t.detach().clone()

    def leaf(self, t):
        t.stop_gradient = False  # a detached clone stops gradient until marked
        return t

    autograd_off_phase = "forward under paddle.no_grad()"
    autograd_off = staticmethod(paddle.no_grad)
    grad_mode = staticmethod(functools.partial(paddle.set_grad_enabled, True))
    zeros_like = staticmethod(paddle.zeros_like)
    grad = staticmethod(paddle.grad)

    def version(self, t) -> int:
        return int(t.inplace_version)

    def host_values(self, t) -> np.ndarray:
        return t.detach().numpy()

    def producers(self) -> dict[str, Callable]:
        F = paddle.nn.functional
        return {"exp": paddle.exp, "sigmoid": F.sigmoid, "softmax": lambda a: F.softmax(a, axis=-1), "relu": F.relu}

    literal_call = "paddle.to_tensor({values}, dtype='{dtype}')"

    apply_owner = paddle.autograd.PyLayer
    module_type = paddle.nn.Layer


PADDLE = PaddleCheckAdapter()


def _as_tensor(x: Any):
    """Inputs as the old Paddle check_op took them: numpy arrays become float64 Paddle tensors."""
    if isinstance(x, np.ndarray):
        return paddle.to_tensor(np.array(x, dtype=np.float64 if x.dtype.kind == "f" else x.dtype, copy=True))
    return x


def _as_callable(op: Any) -> Any:
    return op.apply if isinstance(op, type) and issubclass(op, paddle.autograd.PyLayer) else op


def check_op(op: Any, *inputs: Any, reference: Any = None, **options: Any):
    """Audit a Paddle op's gradients on ``inputs``: the same engine, options and report as the torch ``check_op``.

    ``op`` is a ``paddle.autograd.PyLayer`` subclass (its ``apply`` is called), a Layer or a function of tensors;
    ``inputs`` are Paddle tensors (numpy arrays are taken as float64 tensors) or pass-through values;
    ``reference`` a trusted function of the same inputs. Returns an ``OpReport`` (``.passed``, ``.failures``).
    """
    from ...checks.audit import run_check_op

    return run_check_op(PADDLE, _as_callable(op), tuple(_as_tensor(x) for x in inputs), _as_callable(reference),
                        options)
