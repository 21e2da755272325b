"""Custom autograd.Function and tensor-hook hygiene: writes at a boundary that PyTorch never checks.

Four writes corrupt gradients with no error from PyTorch:

* ``ctx.x = x`` instead of ``ctx.save_for_backward(x)``: the tensor reaches backward with no version check,
  so an in-place write in between (``h += Swish.apply(h)``) makes the gradient silently wrong. Each tensor
  attribute of ctx is recorded like a saved tensor (version, fingerprint, write log) when forward returns,
  and checked when backward starts.
* ``forward`` writing into an input that requires grad without ``ctx.mark_dirty``: autograd keeps treating
  the input as unchanged (its gradient, and every later reader of it, are wrong).
* ``backward`` writing into its incoming gradient while the engine still holds that gradient for another
  node (AddBackward hands one tensor to both of its inputs): that node gets the modified gradient.
* a tensor hook writing into the gradient it receives (``register_hook(lambda g: g.mul_(s))``), same hazard.

# NOTE [What "shared" means for an incoming gradient]
# The engine moves a node's gradients into the call, so a gradient no other node will read has a fixed use
# count at the call: 1 on torch 2.13 and 2.15, 2 on torch 2.4 (Function backward); 2 in a tensor hook. A
# higher count means another holder: a pending input buffer (the other input of an add, a tensor used
# twice), or a gradient the caller passed to ``backward()``. Only then can an in-place write reach someone
# else, so only then is the gradient checked (its version, and its bytes when the guard fingerprints:
# kernels write without a version bump). The baseline is measured once per process on a two-node graph
# (``baselines()``) instead of being hard-coded per torch version.
#
# NOTE [Hygiene costs one dict read per call]
# For a Function call: the versions of the inputs that require grad, one ``vars(ctx)`` scan, and a
# fingerprint per tensor attribute (the cost of a saved tensor). For a backward or a hook: one use count
# per gradient. Nothing is hashed unless a gradient is shared or ctx holds tensors.
"""

from __future__ import annotations

import inspect
import re
import threading
import weakref

import torch

from ...core.facts import Facts
from ...core.findings import Finding, SourceLocation, WriteRecord
from ...core.frames import user_location
from ...core.internal import log_fallback
from .fingerprint import fingerprint as _fingerprint, same as _same
from .naming import name_by_variable, tensor_info

__all__ = ["inputs_before_forward", "after_forward", "before_backward", "after_backward", "checked_hook",
           "tensor_version"]

# ctx -> [(attribute name, weak reference to the tensor ctx held, record)]: the ctx is the key, so the
# entries go when the graph is freed; records of attributes the backward replaced go after it ran.
_ctx_records: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ctx_lock = threading.Lock()
_MAX_ATTRIBUTE_TENSORS = 16  # per ctx: a list of 1000 tensors on ctx is checked in its first 16


_baseline: dict[str, int] = {}


def _measure_baselines() -> dict[str, int]:
    """Use counts of an unshared incoming gradient in a Function backward and in a tensor hook."""
    seen: dict[str, int] = {}

    class _Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen["backward"] = grad._use_count()
            return grad * 2

    def hook(grad):
        seen["hook"] = grad._use_count()

    with torch.enable_grad(), torch.autograd.graph.disable_saved_tensors_hooks("gradguard calibration"):
        x = torch.ones(2, requires_grad=True)
        y = x * 1
        y.register_hook(hook)
        out = _Probe.apply(y) * 3
        torch.autograd.grad(out.sum(), x)
    return seen


def baselines() -> dict[str, int]:
    """Measured once per process, before any guard hook is installed (see NOTE above)."""
    if not _baseline:
        try:
            measured = _measure_baselines()
        except Exception as error:  # no baseline: the shared-gradient check stays off (never a false alarm)
            log_fallback("torch.function_hygiene", "measuring the use count of an unshared gradient", error)
            measured = {}
        _baseline.update({"backward": measured.get("backward", 1 << 30), "hook": measured.get("hook", 1 << 30)})
    return _baseline


def inputs_before_forward(args, kwargs) -> list | None:
    """(label, tensor, version) of the inputs that require grad; None when no gradient can flow."""
    if not torch.is_grad_enabled():
        return None
    return [(label, value, tensor_version(value)) for values in (enumerate(args), kwargs.items())
            for label, value in values if isinstance(value, torch.Tensor) and value.requires_grad]


def tensor_version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return None


def _ctx_of(cls, result):
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    nodes = (out.grad_fn for out in outputs if isinstance(out, torch.Tensor))
    return next((node for node in nodes if node is not None and getattr(node, "_forward_cls", None) is cls), None)


def after_forward(session, cls, inputs: list, result) -> None:
    ctx = _ctx_of(cls, result)
    if ctx is None:
        return
    for label, t, version in inputs:
        # A dirty input (``ctx.mark_dirty``) is returned with its history rebased onto this ctx. An input saved
        # for backward before the call makes the write loud at backward: that finding is the better one.
        if (version is not None and tensor_version(t) != version and t.grad_fn is not ctx
                and not session.saved_before(t, version)):
            session.raise_finding(_input_write_finding(cls, label, t, version))
    _watch_ctx_attributes(session, cls, ctx)


_INTERNAL_CTX = frozenset({"to_save", "saved_for_forward", "non_differentiable", "dirty_tensors",
                           "materialize_grads", "needs_input_grad"})


def _watch_ctx_attributes(session, cls, ctx) -> None:
    try:
        attributes = vars(ctx)
    except TypeError:
        return
    entries = []
    for name, value in list(attributes.items()):
        if name in _INTERNAL_CTX:
            continue
        if isinstance(value, torch.Tensor):
            tensors = [(f"ctx.{name}", value)]
        elif isinstance(value, (list, tuple)) and value and len(value) <= 64:
            tensors = [(f"ctx.{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
        else:
            continue
        for label, t in tensors:
            if len(entries) >= _MAX_ATTRIBUTE_TENSORS:
                break
            record = session.watch_ctx_tensor(t, saver=(f"{cls.__name__}Backward", label))
            if record is not None:
                entries.append((name, weakref.ref(t), record))
    if entries:
        with _ctx_lock:
            _ctx_records[ctx] = entries


def _still_held(ctx, name: str, ref) -> bool:
    value, original = getattr(ctx, name, None), ref()
    return original is not None and (value is original
                                     or isinstance(value, (list, tuple)) and any(v is original for v in value))


def before_backward(session, ctx, grads) -> list | None:
    """Check ctx's tensor attributes; returns what ``after_backward`` needs to check the shared gradients."""
    entries = _ctx_records.get(ctx)
    if entries:
        for name, ref, record in entries:
            if _still_held(ctx, name, ref):
                session.check_ctx_tensor(record)
    limit = baselines()["backward"]
    shared = [(i, g, g._version, _gradient_fingerprint(session, g)) for i, g in enumerate(grads)
              if isinstance(g, torch.Tensor) and g.layout == torch.strided and g._use_count() > limit]
    return shared or None


def after_backward(session, ctx, shared: list | None) -> None:
    entries = _ctx_records.get(ctx)
    if entries:  # attributes the backward dropped (``ctx.x = None``) must not be kept alive by gradguard
        kept = [e for e in entries if _still_held(ctx, e[0], e[1])]
        if len(kept) != len(entries):
            with _ctx_lock:
                _ctx_records[ctx] = kept
    if not shared:
        return
    cls = getattr(ctx, "_forward_cls", None)
    name = getattr(cls, "__name__", type(ctx).__name__)
    for i, g, version, fp in shared:
        if _changed(session, g, version, fp):
            argument = _parameter_name(cls, "backward", i)
            writer = _source_write(getattr(cls, "backward", None), argument)
            session.raise_finding(_grad_write_finding(g, version, f"{name}.backward", writer,
                                                      argument or f"gradient {i}"))


def _gradient_fingerprint(session, g):
    mode = session.fingerprint_mode
    return None if mode == "off" or type(g) is not torch.Tensor else _fingerprint(g.detach(), mode)


def _changed(session, g, version, fp) -> bool:
    return g._version != version or fp is not None and not _same(_fingerprint(g.detach(), session.fingerprint_mode), fp)


def checked_hook(hook, active):
    """``hook`` as registered inside a guard: the same call, plus the shared-gradient check."""

    def gradguard_checked_hook(grad):
        session = active()
        if (session is None or not isinstance(grad, torch.Tensor) or grad.layout != torch.strided
                or grad._use_count() <= baselines()["hook"]):  # not shared: no one else can see a write
            return hook(grad)
        version, fp = grad._version, _gradient_fingerprint(session, grad)
        out = hook(grad)
        if _changed(session, grad, version, fp):
            name = getattr(hook, "__name__", type(hook).__name__)
            try:
                argument = next(iter(inspect.signature(hook).parameters), None)
            except (TypeError, ValueError):
                argument = None
            session.raise_finding(_grad_write_finding(grad, version, f"tensor hook {name}",
                                                      _source_write(hook, argument), argument or "grad", hook=True))
        return out

    gradguard_checked_hook.__wrapped__ = hook
    return gradguard_checked_hook


def _parameter_name(cls, method: str, index) -> str | None:
    """The name of argument ``index`` of ``cls.forward``/``cls.backward`` as the user wrote it."""
    if isinstance(index, str):
        return index
    try:
        names = list(inspect.signature(getattr(cls, method)).parameters)
    except (TypeError, ValueError, AttributeError):
        return None
    base = torch.autograd.function._SingleLevelFunction.setup_context
    takes_ctx = method == "backward" or getattr(cls, "setup_context", base) is base
    names = names[1:] if takes_ctx else names
    return names[index] if 0 <= index < len(names) else None


def _source_write(fn, name: str | None) -> SourceLocation | None:
    """The first line of ``fn`` that writes ``name`` in place (``name.mul_(``, ``name *=``, ``name[i] =``)."""
    if fn is None or not name:
        return None
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        lines, start = inspect.getsourcelines(fn)
        path = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}"
                         r"(\.\w+_\(|\s*(\+|-|\*|/|//|%|\*\*|&|\|)=(?!=)|\[[^\]]*\]\s*=(?!=))")
    for offset, line in enumerate(lines):
        if pattern.search(line.split("#", 1)[0]):
            return SourceLocation(path, start + offset, fn.__name__)
    return None


def _input_write_finding(cls, label, t: torch.Tensor, version: int) -> Finding:
    argument = _parameter_name(cls, "forward", label) or f"argument {label}"
    call = user_location(3)
    writer = _source_write(cls.forward, argument)
    write = WriteRecord(op=f"{cls.__name__}.forward", location=writer or call, via=f"{cls.__name__}.apply",
                        version_before=version, version_after=t._version, category="function_input")
    where = f" at {call.short}" if call is not None else ""
    return Finding(
        kind="undeclared_input_write",
        tensor=tensor_info(t, name_by_variable(t), "leaf" if t.is_leaf else "activation"),
        modified_at=[write],
        facts=Facts(function=cls.__name__, argument=argument, call=call.to_dict() if call else None,
                    display=[("call", f"{cls.__name__}.apply{where}"),
                             ("input", f"`{argument}`: version {version} before forward, {t._version} after, "
                                       f"not marked dirty")]),
    )


def _grad_write_finding(g: torch.Tensor, version: int, writer_name: str, writer: SourceLocation | None,
                        argument: str, hook: bool = False) -> Finding:
    write = WriteRecord(op=writer_name, location=writer, via=None, version_before=version,
                        version_after=g._version, bumps_version=g._version != version,
                        category="hook_grad" if hook else "backward_grad")
    backward = user_location(3)
    display = [("gradient", f"`{argument}`, also handed to another node that had not run yet")]
    if backward is not None:
        display.append(("backward", f"called at {backward.short}"))
    return Finding(
        kind="shared_grad_write",
        tensor=tensor_info(g, argument, "gradient"),
        modified_at=[write],
        facts=Facts(writer=writer_name, argument=argument, hook=hook,
                    backward_at=backward.to_dict() if backward else None, display=display),
    )
