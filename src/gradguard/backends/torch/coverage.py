"""Which optimizer parameters each backward reaches: how ``gradguard fix`` tells a repair from a cut.

# NOTE [A fix must keep the gradients the optimizer uses]
# "The error is gone" is not enough to call an edit a fix: `.detach()` in the wrong place removes the error
# *and* the gradient of every layer behind it (a detach inside a critic's forward, or on the actions every
# agent's actor loss needs). So during ``gradguard fix`` runs (``GRADGUARD_GRADIENT_COVERAGE`` names a file),
# every backward call records the leaves its graph reaches (walked before backward runs, so a backward that
# then fails is recorded too), and every optimizer step records its parameters, keyed by (optimizer in the order
# they are made, parameter index): keys that are the same in the original and the edited run. A backward's
# *used* set is what it reaches among the parameters of the steps that follow it (before the next backward).
# An edit verifies only if each backward of the edited run still reaches the used set of the same backward
# of the original run (reaches, not uses: an edit may move the step after a later backward; "the same backward" is
# the same call, by its file and line text, where an edit reorders the calls), and, for an
# optimizer whose next step in the edited run no backward feeds at all, what the original's backward reached of its
# parameters (the original may fail before its first step: a detach that lets the run finish must not leave a
# whole optimizer stepping on nothing).
# Gradients that no step consumes (a generator's parameters reached by the discriminator's loss) are free to go:
# that is what `netD(fake.detach())` is for. Only the fix runs pay for this (one graph walk per backward).
"""

from __future__ import annotations

import atexit
import json
import linecache
import os
import sys
import threading

from ..._overlay import COVERAGE_ENV

__all__ = ["install_coverage_probe"]
_installed = False


def _reached_leaves(roots) -> set[int]:
    """ids of the leaves (AccumulateGrad variables) reachable from the grad_fns of ``roots``."""
    import torch

    from .graph import walk_nodes

    grad_fns = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    variables = (getattr(node, "variable", None) for node in walk_nodes(grad_fns))
    return {id(variable) for variable in variables if isinstance(variable, torch.Tensor)}


class _Recorder:
    def __init__(self, path: str):
        self.path = path
        self.events: list = []  # ("backward", set of leaf ids) | ("step" or "made", {leaf id: key})
        self.optimizers: dict[int, tuple[int, object]] = {}  # id -> (order made, the optimizer: kept
        # alive so that no later optimizer reuses its id)

    def backward(self, roots, site: str | None) -> None:
        self.events.append(("backward", (_reached_leaves(roots), site)))

    def step(self, optimizer, kind: str = "step") -> None:
        index, _ = self.optimizers.setdefault(id(optimizer), (len(self.optimizers), optimizer))
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.events.append((kind, {id(p): f"{index}:{i}" for i, p in enumerate(params)}))

    def used_sets(self) -> list[dict[str, list[str]]]:
        """Per backward: ``used``, the keys it reached among the parameters that the steps before the next
        backward update; ``reached``, every optimizer parameter it reached (an edit may move a step);
        ``stepped``, every parameter those steps update, reached or not."""
        every: dict[int, str] = {}
        # per backward: (the leaves it reached, its call site, the leaves the steps after it update)
        passes: list[tuple[set, str | None, set]] = []
        for kind, data in self.events:
            if kind == "backward":
                passes.append((*data, set()))
                continue
            for leaf, key in data.items():  # a parameter two optimizers hold keeps the key of the first made
                every.setdefault(leaf, key)
            if passes and kind == "step":
                passes[-1][2].update(data)
        return [{"used": sorted(every[leaf] for leaf in stepped if leaf in reached),
                 "reached": sorted(key for leaf, key in every.items() if leaf in reached),
                 "stepped": sorted(every[leaf] for leaf in stepped), "site": site}
                for reached, site, stepped in passes]

    def write(self) -> None:
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump(self.used_sets(), handle)


def install_coverage_probe() -> None:
    """Record the used set of every backward of this process into ``$GRADGUARD_GRADIENT_COVERAGE`` at exit."""
    global _installed
    path = os.environ.get(COVERAGE_ENV)
    if not path or _installed:
        return
    import torch

    _installed = True
    recorder = _Recorder(path)
    tensor_backward, autograd_backward = torch.Tensor.backward, torch.autograd.backward

    # Tensor.backward calls torch.autograd.backward: record once, at the outermost call.
    inside = threading.local()

    torch_files = os.path.dirname(torch.__file__)

    def site() -> str | None:
        """The call of the backward as the program spells it (file and line text: an edit that moves the
        statement keeps it), from the first frame outside torch."""
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(torch_files):
            frame = frame.f_back
        if frame is None:
            return None
        return f"{frame.f_code.co_filename}|{linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()}"

    def backward_method(self, *args, **kwargs):
        recorder.backward([self], site())
        inside.tensor_backward = True
        try:
            return tensor_backward(self, *args, **kwargs)
        finally:
            inside.tensor_backward = False

    def backward_function(tensors, *args, **kwargs):
        if not getattr(inside, "tensor_backward", False):
            recorder.backward([tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ()), site())
        return autograd_backward(tensors, *args, **kwargs)

    torch.Tensor.backward = backward_method
    torch.autograd.backward = backward_function
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: recorder.step(optimizer))
    # optimizers are keyed in the order they are made, so that a run that fails before its first step still says
    # which of the parameters its backwards reached an optimizer holds
    made = torch.optim.Optimizer.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        recorder.step(self, "made")

    torch.optim.Optimizer.__init__ = init
    atexit.register(recorder.write)
