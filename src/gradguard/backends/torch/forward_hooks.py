"""Module forward hooks for the silent classes the sentinel cannot see through saved tensors (no write log):
a module writing its caller's input in place (module_inputs.py), and a forward changing its own parameter
through ``.data`` before using it (data_in_forward.py).

# NOTE [Silent classes without the write log]
# Both classes change a tensor without a version bump autograd would check later (the caller's input is read
# by an add, which saves nothing; a ``.data`` write has its own version counter), so only forensic mode's write
# log used to see them. Two global module hooks see them in every mode: before a forward, the versions of the
# tensors passed in (and, for a forward whose source writes ``.data`` from the old value, a copy of the
# module's own parameters); after it, a changed version means the module wrote its caller's tensor, and the
# caller's source says whether it reads that tensor again (core/later_reads.py); a changed parameter that the
# output's graph uses means the normalisation is invisible to autograd. The price is paid per module call:
# global hooks take torch's module call off its fast path, and each call costs the two hooks (measured in
# benchmarks/bench_forward_hooks.py). Forensic mode keeps its write-log checks and installs none of this.
"""

from __future__ import annotations

import sys
import traceback
import warnings

import torch

from ...core.internal import log_fallback
from . import data_in_forward as _data_in_forward, module_inputs as _module_inputs

__all__ = ["ForwardHooks"]

_CALL_IMPL = getattr(torch.nn.Module._call_impl, "__code__", None)


def _inside_another_module_call() -> bool:
    """Whether more than one ``Module._call_impl`` frame is on the stack: the one whose post-hook runs, and another."""
    calls = (frame for frame, _line in traceback.walk_stack(sys._getframe(1)) if frame.f_code is _CALL_IMPL)
    return next(calls, None) is not None and next(calls, None) is not None


# NOTE [The global-hooks warning of torch.compile]
# Since torch 2.5 calling a `torch.compile`d module warns whenever any global module hook is installed ("Using
# `torch.compile(module)` when there are global hooks on modules ..."). Ours would print it into a program that
# prints nothing without gradguard, so while they are installed that one warning is filtered out, unless global
# hooks of the user's own were there first (then torch warned without us too). The filter is removed on exit.
_COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


class ForwardHooks:
    """The two global hooks of one guard session, and what the pre-hook passes to the post-hook."""

    def __init__(self, report) -> None:
        self._report = report  # session.report_extra
        self._stack: list = []  # per module call in progress: (module, (input versions, parameter copies) | None)
        self._writers: dict = {}  # id(tensor) -> the innermost module seen writing it (a ReLU in a Sequential)
        self._reported: set = set()
        self._pending: list = []  # NOTE [Every .data write of one forward in one finding]
        self._handles: list = []
        self._filter: tuple | None = None  # NOTE [The global-hooks warning of torch.compile]

    def install(self) -> None:
        from torch.nn.modules import module as nn_module

        if self._handles:  # installed already (a sampled guard puts them back each sampled cycle)
            return
        if not getattr(nn_module, "_has_any_global_hook", lambda: True)():
            warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
            self._filter = warnings.filters[0]
        self._handles = [nn_module.register_module_forward_pre_hook(self._before),
                         nn_module.register_module_forward_hook(self._after)]

    def uninstall(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        if self._filter is not None:
            if self._filter in warnings.filters:
                warnings.filters.remove(self._filter)
                getattr(warnings, "_filters_mutated", lambda: None)()  # the module's cache of decisions
            self._filter = None
        self._stack.clear()
        self._pending.clear()
        self._writers.clear()  # modules are not kept past the guard

    def _before(self, module, args) -> None:
        if torch.compiler.is_compiling():
            # Dynamo traces global hooks into the compiled graph: touching our state there (even a push of the
            # module) makes it track that module twice and fail; compiled regions are watched by their saved
            # tensors. The post-hook below pops down to its own module, so an unpaired call is harmless.
            return
        if not torch.is_grad_enabled():
            self._stack.append((module, None))
            return
        inputs = [(t, t._version) for t in args if type(t) is torch.Tensor and not t.is_inference()]
        parameters = _data_in_forward.parameters_before(module)
        self._stack.append((module, (inputs, parameters) if inputs or parameters else None))

    def _after(self, module, args, output) -> None:
        if torch.compiler.is_compiling():  # see _before
            return
        stack = self._stack
        while stack and stack[-1][0] is not module:  # a forward that raised never reached its post-hook
            stack.pop()
        if not stack:
            return
        _module, entry = stack.pop()
        if entry is None:
            self._flush_when_outermost()
            return
        inputs, parameters = entry
        try:
            finding = None
            for tensor, version in inputs:
                if tensor._version != version:
                    inner = self._writers.pop(id(tensor), None)
                    finding = _module_inputs.caller_reads_again(module, tensor, inner)
                    if finding is not None:
                        break
                    self._writers[id(tensor)] = inner if inner is not None else module
                    if len(self._writers) > 64:
                        self._writers.clear()
            if finding is None and parameters:
                finding = _data_in_forward.changed_in_forward(module, parameters, output)
        except Exception as error:  # only a check: the user's forward result stands
            log_fallback("torch.forward_hooks", "checking a module's forward for a silent write", error)
            return
        if finding is not None and finding.kind == "data_write_in_forward":
            self._pending.append(finding)
        elif finding is not None:
            self._report_once(finding)
        self._flush_when_outermost()

    # NOTE [Every .data write of one forward in one finding]
    # A model whose forwards change parameters through `.data` usually does it in several places (a pruning mask
    # applied to every conv, in each block and in the stem). Raising at the first block's post-hook would name one
    # write; the outer forwards' writes, whose post-hooks run later, never. So these findings wait until the
    # outermost module call ends and are reported as one, every write listed. A forward that raised never reached
    # its post-hook and left its entry on the stack, so "outermost" is asked of the frames (only while a finding
    # waits): no other `Module._call_impl` encloses the call ending now. The user's error stands; what waited is
    # reported when the next outermost call ends.
    def _flush_when_outermost(self) -> None:
        if not self._pending or (self._stack and _inside_another_module_call()):
            return
        self._stack.clear()  # entries of forwards that raised: no module call is in progress
        first, *others = self._pending
        self._pending = []
        seen = {(w.location.file, w.location.line) for w in first.modified_at if w.location is not None}
        for other in others:
            for write in other.modified_at:
                where = (write.location.file, write.location.line) if write.location is not None else None
                if where not in seen:
                    seen.add(where)
                    first.modified_at.append(write)
        self._report_once(first)

    def _report_once(self, finding) -> None:
        key = (finding.kind, finding.modified_at[0].location.file, finding.modified_at[0].location.line)
        if key not in self._reported:
            self._reported.add(key)
            self._report(finding)
