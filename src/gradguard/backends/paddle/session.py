"""The Paddle probe (dygraph): saved-tensor hooks and write wrappers that feed the core guard engine
(:class:`gradguard.core.engine.GuardEngine`), and its answers to the engine's questions about Paddle tensors.

# NOTE [Paddle's hooks: what they switch off and what they must never do]
# Measured on paddlepaddle 3.3.1:
#   * installing ``paddle.autograd.saved_tensors_hooks`` switches Paddle's own version check off, so the
#     engine redoes it at unpack (saved ``inplace_version`` vs current), plus a content fingerprint because
#     ``set_value`` and ``copy_`` write without bumping the version;
#   * an exception raised inside ``unpack`` leaves autograd globally disabled (``paddle.is_grad_enabled()``
#     stays False and later backwards give ``grad=None``). So the probe sets ``raise_at_unpack = False``: the
#     engine only records the problem; it raises at the ``BackwardEnded`` event our wrapper around
#     ``Tensor.backward`` / ``paddle.grad`` emits once backward returns, at the user's backward line;
#   * for a ``PyLayer``, a tuple or list returned by ``pack`` is iterated and unpack is called on each
#     element: pack returns a non-sequence record object;
#   * hooks cannot nest ("only one pair of hooks is allowed at a time"): a guard entered inside another
#     Paddle guard joins the outer session.
#   * ``PyLayer`` saved tensors (``ctx.save_for_backward``) are never version-checked by Paddle; ours are.
#
# NOTE [Seeing writes without a dispatch mode]
# Paddle has no dispatch/function mode. The session wraps the public in-place entry points while it is
# active (``Tensor.*_``, ``__setitem__``, ``set_value``, the ``paddle.*_`` and ``paddle.nn.functional.*_``
# functions, ``paddle.assign(x, output)``) and compares the target's version before and after each call:
# a write that does not bump it is marked silent. ``paddle._C_ops.*_`` and C++-internal writes are not seen
# by the log, but the version/fingerprint check still catches their effect on saved tensors.
"""

from __future__ import annotations

import sys
from typing import Any

import paddle

from ...core.engine import phrase_fix
from ...core.events import BackwardEnded, BackwardStarted, TensorSaved
from ...core.facts import Facts
from ...core.findings import Finding, TensorInfo
from ...core.frames import LIBRARY_PATHS, user_location
from ...core.source_ast import call_name
from ..adapter import ProbeBase, name_by_memory, parameters_and_buffers
from ...core.internal import log_fallback

__all__ = ["PaddleGuardSession", "paddle_fix", "name_tensor", "memory_range"]

LIBRARY_PATHS.add(paddle.__path__[0])

_ACTIVATIONS = {"relu_", "tanh_", "sigmoid_", "elu_", "leaky_relu_", "hardtanh_", "softmax_", "thresholded_relu_",
                "celu_", "selu_", "silu_", "gelu_", "hardsigmoid_", "hardswish_", "mish_", "clip_", "exp_"}
_NOT_WRITES = {"requires_grad_", "grad_", "stop_gradient_", "retain_grads", "register_hook"}
_active: list["PaddleGuardSession"] = []  # sessions whose hooks are installed (Paddle allows one pair)


def memory_range(t) -> tuple[int, int, int] | None:
    """(storage key, start, end): Paddle exposes no storage object, so one address space (key 0) with
    absolute byte addresses. Views (slices, reshapes) fall inside their base's range."""
    try:
        ptr = t.data_ptr()
        n = int(t.size) * t.element_size()
    except Exception as error:
        log_fallback("backends.paddle", "reading data_ptr/size", error)
        return None
    if not ptr or n <= 0:
        return None
    return 0, ptr, ptr + n


def name_tensor(t) -> tuple[str | None, str | None]:
    """(qualified name, "parameter" | "buffer") of the layer tensor sharing ``t``'s memory, or (None, None):
    "net.fc.weight" rather than "linear_0.w_0". A heap scan for ``paddle.nn.Layer`` objects on the error path, as
    the torch backend does (its NOTE [Why a heap scan, only on the error path])."""
    rng = memory_range(t)
    if rng is None:
        return None, None
    ptr = rng[1]
    return name_by_memory(paddle.nn.Layer, lambda layer: layer.children(), parameters_and_buffers,
                          lambda value: value.data_ptr() == ptr)


def _pylayer_saver(skip: int) -> str | None:
    """``MySin`` when the pack hook runs inside a PyLayer's ``forward`` (``ctx.save_for_backward``)."""
    frame = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "forward" and "ctx" in frame.f_locals:
            ctx = frame.f_locals["ctx"]
            if type(ctx).__name__.endswith("PyLayerContext") or hasattr(ctx, "save_for_backward"):
                return getattr(code, "co_qualname", "PyLayer.forward").rsplit(".", 1)[0]
        frame = frame.f_back
    return None


class PaddleGuardSession(ProbeBase):
    """The Paddle probe: installs hooks and the write log between ``enter()`` and ``exit()``."""

    backend = "paddle"
    tensor_type = paddle.Tensor
    version_attribute = "inplace_version"
    raise_at_unpack = False  # see NOTE [Paddle's hooks: what they switch off and what they must never do]
    framework = "Paddle"
    # who writes memory without a Paddle op, and the fix (the engine's wording of a silent write no op made)
    direct_writers = ("code that writes the tensor's memory directly: a DLPack consumer (`np.from_dlpack(t)` "
                      "shares Paddle's memory; `t.numpy()` does not), ctypes, or a C++/CUDA extension using "
                      "`data_ptr()`")
    optimizer_fix = ("Call `optimizer.step()` after the `backward()` of every forward pass that used the parameters "
                     "(forward, backward, step, in that order).")
    direct_write_fix = ("Give the other library a copy (`np.from_dlpack(t.clone())`, `t.numpy()`), or make the "
                        "update with Paddle ops on a new tensor after the backward that needs the old values.")

    def __init__(self, *, fingerprint: str = "full", track_writes: bool = True, bisect: bool = False):
        super().__init__(fingerprint=fingerprint, track_writes=track_writes, bisect=bisect)
        self._outer: PaddleGuardSession | None = None
        self._writes_on = False
        self._lent: list = []  # write patches made on the outer session for this inner one (undone at exit)

    @property
    def findings(self) -> list[Finding]:
        return (self._outer or self).engine.findings

    # -- lifecycle -----------------------------------------------------------------------------
    def enter(self) -> None:
        if _active:  # Paddle cannot nest hooks: join the outer session
            outer = self._outer = _active[-1]
            if self.track_writes and not outer._writes_on:
                # NOTE [Nested write log]: `gradguard run` (sentinel, no write log) around a script's own
                # `guard()` (forensic): the inner guard asks for the write log, so the outer session logs
                # writes while the inner one is open, as torch's nested guard does.
                mark = len(outer._patches)
                outer._patch_writes()
                outer._writes_on = outer.engine.track_writes = True
                self._lent, outer._patches[mark:] = outer._patches[mark:], []
            return
        self._hooks = paddle.autograd.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        _active.append(self)
        try:
            self._patch_backward()
            if self.track_writes:
                self._patch_writes()
                self._writes_on = True
            self.engine.start(skip=3)
        except BaseException:
            self.exit()
            raise

    def exit(self) -> None:
        if self._outer is not None:
            if self._lent:
                self._outer._unpatch(self._lent)
                self._outer._writes_on = self._outer.engine.track_writes = False
                self._lent = []
            return
        if self in _active:
            _active.remove(self)
        super().exit()

    # -- hooks -> events (never raise: see NOTE) ----------------------------------------------
    def _pack(self, t):
        try:
            pylayer = _pylayer_saver(2)
            site = user_location(2)
            grad_fn = t.grad_fn
            producer = grad_fn.name() if grad_fn is not None else ("leaf" if not t.stop_gradient else None)
        except Exception as error:
            log_fallback("backends.paddle", "reading the saving site and producer", error)
            pylayer, site, producer = None, None, None
        if pylayer is not None:
            saver = f"{pylayer}.forward (PyLayer ctx.save_for_backward)"
        else:
            saver = call_name(site.code) if site is not None and site.code else None
        return self.engine.emit(TensorSaved(t, site, saver, producer, pylayer))

    # -- the engine's questions ----------------------------------------------------------------
    memory_range = staticmethod(memory_range)
    to_numpy = staticmethod(lambda t: t.numpy())

    name_tensor = staticmethod(name_tensor)

    @staticmethod
    def dtype_name(t) -> str:
        return str(t.dtype).replace("paddle.", "")

    @staticmethod
    def device_name(t) -> str:
        place = str(t.place)
        return "cpu" if place.lower().startswith("place(cpu") else place

    def context(self) -> Facts:
        return Facts(mode="eager (dygraph)", paddle_version=paddle.__version__, optimizers_bump_versions=False)

    def saver_name(self, record, tensor: TensorInfo) -> str | None:
        if record.saver is None and tensor.role in ("parameter", "buffer") and tensor.name and "." in tensor.name:
            # saved inside a layer's forward (no op on the user's line takes it): name the layer
            return f"the forward of {tensor.name.rsplit('.', 1)[0]}"
        return record.saver

    def phrase(self, finding: Finding, record) -> None:
        if record.custom_function is not None:
            finding.notes.append(f"Paddle itself does not version-check tensors saved by PyLayer "
                                 f"ctx.save_for_backward: without gradguard {record.custom_function}'s gradient would "
                                 f"be silently wrong here.")
        elif finding.kind == "silent_write":
            finding.notes.append("Paddle's version counter did not move (set_value, copy_ and the optimizer kernels do "
                                 "not bump it): without gradguard this gradient would be silently wrong.")
        paddle_fix(finding)

    def restore_after_error(self) -> None:
        if not paddle.is_grad_enabled():  # defensive: an unpack failure elsewhere can leave it off
            paddle.set_grad_enabled(True)

    # -- backward wrappers -> BackwardStarted / BackwardEnded ----------------------------------
    def _patch_backward(self) -> None:
        engine = self.engine

        def wrap(original):
            def backward(*args, **kwargs):
                site = user_location(2)
                engine.emit(BackwardStarted(site))
                failed = True
                try:
                    out = original(*args, **kwargs)
                    failed = False
                    return out
                finally:
                    engine.emit(BackwardEnded(site, failed=failed))

            backward.__wrapped__ = original
            return backward

        self._patch(paddle.Tensor, "backward", wrap(paddle.Tensor.backward))
        grad = wrap(paddle.grad)
        self._patch(paddle, "grad", grad)
        self._patch(paddle.autograd, "grad", grad)
        self._patch(paddle.autograd, "backward", wrap(paddle.autograd.backward))

    # -- write wrappers -> TensorWritten -------------------------------------------------------
    def _patch_writes(self) -> None:
        entries = [(owner, name, f"{_prefix(owner)}.{name}", _target(0, "self" if owner is paddle.Tensor else "x"))
                   for owner, name in _write_entry_points()]
        for owner, name, op, target_of in [*entries, (paddle, "assign", "paddle.assign(..., output)",
                                                      _target(1, "output"))]:
            category = _category(op, name)
            self._patch(owner, name, self._writer(getattr(owner, name), op, category, target_of,
                                                  via=op if category == "activation" else None))
        # ``Optimizer.step`` is a write boundary: Paddle's optimizer kernels (``_C_ops.sgd_``, ``adam_``) update
        # parameters WITHOUT bumping ``inplace_version`` (measured on 3.3.1), so a step between a forward and its
        # backward is silently wrong in plain Paddle. Only parameters saved for backward are compared.
        for cls in [paddle.optimizer.Optimizer, *_subclasses(paddle.optimizer.Optimizer)]:
            if "step" in cls.__dict__:
                self._patch(cls, "step", self._updater(cls.__dict__["step"], "paddle.optimizer.", "{}.step()",
                                                       _parameters, "busy"))


def _prefix(owner) -> str:
    return "paddle.Tensor" if owner is paddle.Tensor else owner.__name__


def _write_entry_points() -> list[tuple[Any, str]]:
    """(owner, name) of the public in-place entry points (NOTE [Seeing writes without a dispatch mode])."""
    found: list[tuple[Any, str]] = []
    for owner in (paddle.Tensor, paddle, paddle.nn.functional):
        for name in dir(owner):
            value = getattr(owner, name, None)
            if (name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES and callable(value)
                    and (owner is paddle.Tensor or not isinstance(value, type))):
                found.append((owner, name))
        if owner is paddle.Tensor:
            found += [(paddle.Tensor, "__setitem__"), (paddle.Tensor, "set_value")]
    return found


def _subclasses(cls) -> list:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _parameters(optimizer) -> list:
    out = []
    for item in getattr(optimizer, "_parameter_list", None) or []:
        out += list(item.get("params", ())) if isinstance(item, dict) else [item]
    return [p for p in out if isinstance(p, paddle.Tensor)]


def _category(op: str, short: str) -> str:
    if short in _ACTIVATIONS and not op.startswith("paddle.Tensor."):
        return "activation"
    return ProbeBase._write_category(short)


_FIXES = {
    "inplace_activation": "Use the out-of-place form: `paddle.nn.functional.relu(x)` instead of `F.relu_(x)`, "
    "`paddle.tanh(x)` instead of `paddle.tanh_(x)`.",
    "index_assignment": "Assign into a copy (`y = x.clone(); y[idx] = value`) so the saved tensor stays intact, or "
    "build the result out of place (`paddle.where(mask, value, x)`).",
    "generic_inplace": "Clone before the in-place write (`y = x.clone()` and write into y), or use the out-of-place "
    "op (`x.add(v)` instead of `x.add_(v)`, `paddle.assign(v)` instead of `paddle.assign(v, x)`).",
    "unseen_write": "Enter `gradguard.guard()` before the forward pass that saved the tensor, so the hooks see "
    "the save and the write log sees the write.",
}


def paddle_fix(finding: Finding) -> Finding:
    """Replace torch-specific fixes of the generic rules by Paddle spellings."""
    phrase_fix(finding, _FIXES)
    if finding.rule == "silent_set_value":  # the row's subject: the first write no version counter saw
        write = next(w for w in finding.modified_at if not w.bumps_version)
        where = write.location.short if write.location else "an unknown line"
        finding.explanation = (
            f"{write.op} at {where} overwrote a tensor that {finding.saved_at.op or 'an op'} saved for backward. "
            "Paddle's set_value and copy_ do not bump the version counter, so Paddle computes the gradient from the "
            "new values without any error."
        )
        finding.suggestion = ("Write the new values into a fresh tensor (`y = paddle.full_like(y, v)` / "
                              "`y = v.clone()`) instead of set_value/copy_ on a tensor the graph still needs, or "
                              "do it after backward.")
    return finding


def _target(index: int, keyword: str):
    """The tensor a write entry point writes: its ``index``-th argument, or the ``keyword`` one."""
    return lambda args, kwargs: args[index] if len(args) > index else kwargs.get(keyword)
