"""Facts: what a probe or a producer of findings saw beyond the finding's tensor and writes (its JSON: "context").

The diagnosis rules read them (``finding.facts.loss_made_early``), the reports show some (``display``, ``graph``,
``rank``), and ``gradguard fix`` reads them back from ``gradguard run --json`` (``Finding.from_dict``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from .findings import SourceLocation
    from .fixes import CarriedState

__all__ = ["Facts", "CrossingTensor"]


class _Unset:
    """The default of every fact before ``__post_init__`` turns it into None: tells a fact given as None to the
    constructor (set, written as null) from one not given (not set, not written)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "None"


_UNSET: Any = _Unset()

# NOTE [Facts]
# ``Facts.to_dict()`` is the finding's JSON "context", byte for byte what the dict it replaces gave: the facts that
# were set, in the order they were set, a fact set to None included (``"retain_graph": null``: the torch probe
# sets it on every finding it annotates). So a Facts remembers which facts were set and in what order
# (``_order``): the constructor sets the facts it is given, None included, in the order of the fields below (chosen
# so that every producer's constructor call gives the order it gave as a dict literal); an assignment afterwards
# sets one where it is (the first assignment of a fact fixes its place, as a dict key's). A fact not set reads
# None. ``from_dict`` sets the keys in the order the JSON gives them; a key that is no field (JSON written by
# another version of gradguard) is kept in ``extra`` and written back in its place, never dropped and never an
# error: old JSON still loads and ``gradguard fix`` hands it on unchanged.
# Locations are the JSON of ``SourceLocation.to_dict()`` (``SourceLocation.from_dict`` reads them), as in the JSON.

# NOTE [Rule inputs]
# The facts after "rule inputs" are what a probe hands the rule rows and nothing else reads: they are never written
# to the JSON (nor read from it, nor shown by repr), since the verdict the rows build from them (explanation,
# suggestion, fixes, display) is. Typed as the probe gives them (SourceLocation, not its JSON), default None.


_INPUT = {"input": True}  # the metadata of a rule input's field


@dataclass(frozen=True)
class CrossingTensor:
    """The tensor by which the failing backward's graph reaches a graph an earlier backward freed (torch's eager)."""

    name: str  # how the user reaches it: `data`, `outputs[0]`, `net.block.sn1.v`
    made: SourceLocation | None  # the statement that made (assigned) it
    used: SourceLocation | None  # the call that fed it into the earlier backward's graph, before that backward
    callee: str | None  # that call's callee as written (`netD`)
    holder: str | None  # "variable" | "element" | "attribute" | "module attribute" | "loss"; None: found by name
    binding: str | None  # the assignment target where it is made (`self.v`)
    holds_sequence: bool  # the name holds a tuple or list of tensors (an LSTM's (h, c))
    read: SourceLocation | None = None  # module state its class never assigns: the statement that reads it back
    # a list or deque of items the crossing is (or is in), then the others held beside it with as many items (an
    # episode's buffers filled in step: `policy.saved_log_probs`, `policy.rewards`), as the user reaches them
    kept_with: tuple[str, ...] = ()


@dataclass(slots=True, repr=False)
class Facts:
    """Facts about one finding: each None (or not set) unless its producer saw it. The comment on each field says
    what it is and who sets it."""

    _order: list[str] = field(default_factory=list, init=False, compare=False)  # the names set, in order
    # -- the framework's session (``Probe.context()``, every finding the engine builds) --
    mode: str | None = _UNSET  # the framework's execution mode ("eager (dygraph)", "pynative"): paddle and mindspore
    device: str | None = _UNSET  # the device target ("CPU", "Ascend"): mindspore's probe
    paddle_version: str | None = _UNSET  # paddle.__version__: paddle's probe
    mindspore_version: str | None = _UNSET  # mindspore.__version__: mindspore's probe
    # False where no optimizer of the framework bumps a version counter (paddle's and mindspore's probes): an update
    # between a forward and its backward is then the step's order, not a fused kernel (the optimizer rules' rows)
    optimizers_bump_versions: bool | None = _UNSET
    # -- the subject of a finding a torch probe builds itself (function hygiene, module inputs, .data writes) --
    writer: str | None = _UNSET  # the custom backward or hook that wrote a shared gradient: function_hygiene
    function: str | None = _UNSET  # the autograd.Function whose forward wrote an undeclared input: function_hygiene
    name: str | None = _UNSET  # the caller's variable a module wrote in place: module_inputs
    target: str | None = _UNSET  # the parameter written through .data in a forward ("lin.weight"): data_in_forward
    used_at: dict[str, Any] | None = _UNSET  # location: where the forward used that parameter: data_in_forward
    module: str | None = _UNSET  # the writing module ("ReLU(inplace=True)", a class): module_inputs, data_in_forward
    argument: str | None = _UNSET  # the Function's argument or gradient name that was written: function_hygiene
    hook: bool | None = _UNSET  # True when a tensor hook (not a custom backward) wrote the gradient: function_hygiene
    call: dict[str, Any] | None = _UNSET  # location: the Function.apply or module call: function_hygiene, module_inputs
    read: dict[str, Any] | None = _UNSET  # location: where the caller read the written input again: module_inputs
    module_rank: list[int] | None = _UNSET  # [k, n]: the k-th of n inplace modules of its class: module_inputs
    gradient_at: dict[str, Any] | None = _UNSET  # location: torch.autograd.grad(create_graph=True): second_order
    # -- where backward ran: the engine (its last backward call), torch's annotate, eager, function_hygiene --
    backward_at: dict[str, Any] | None = _UNSET  # location: the user's backward call; None when not found
    # -- shown and quoted --
    display: list[tuple[str, str]] | None = _UNSET  # (label, text) lines every report shows: the probes' findings
    torch_message: str | None = _UNSET  # the error torch raised, verbatim: torch's eager enrichment
    paddle_message: str | None = _UNSET  # the first line of paddle's error: paddle's eager enrichment
    mindspore_message: str | None = _UNSET  # the first line of mindspore's error: mindspore's eager enrichment
    checked: str | None = _UNSET  # when the silent write was seen ("at the end of the backward pass"): device_check
    # -- saved_tensors_hooks of the user's (torch session, a failed round trip through pack and unpack) --
    user_hooks: str | None = _UNSET  # what unpack changed: "shape", "layout" or "values"
    packed: dict[str, list[int]] | None = _UNSET  # {"shape", "strides"} of the tensor pack was given
    unpacked: dict[str, list[int]] | None = _UNSET  # {"shape", "strides"} of the tensor unpack returned
    writer_unknowable: bool | None = _UNSET  # True: no write to look for (no re-run, no write-log-off note)
    # -- torch's annotate (``TorchProbe.annotate``, every finding the torch engine builds) --
    backward_passes_since_save: int | None = _UNSET  # backward passes between the save and the failing one
    retain_graph: bool | None = _UNSET  # True when the backward call passes retain_graph=True, else None
    write_log: bool | None = _UNSET  # whether writes were logged (False: the sentinel, no writer to name)
    loss_made_early: dict[str, Any] | None = _UNSET  # {"file", "line", "code", "name", "after_line"}: backward_calls
    recompute_in_loop: dict[str, Any] | None = _UNSET  # {"file", "line", "code", "name", "made_line"}: backward_calls
    graph: dict[str, Any] | None = _UNSET  # the autograd graph around the saver (HTML report): backends/torch/graph.py
    module_files: list[str] | None = _UNSET  # more files to look in for a writer module's construction: none yet
    # -- added after the run --
    rank: int | None = _UNSET  # the torchrun rank: integrations/distributed.py tag_findings
    world_size: int | None = _UNSET  # the torchrun world size: integrations/distributed.py tag_findings
    verified_fix: str | None = _UNSET  # the unified diff a re-run verified: `gradguard fix --html` (fix/cli.py)
    # -- rule inputs (NOTE [Rule inputs]): torch's eager enrichment (backends/torch/eager.py) --
    # the eager check PyTorch failed: "leaf", "view_of_leaf", "multi_output_view", "no_grad_view" (or
    # "no_grad_view_base": its base written, the view read),
    # "custom_function_view", "backward_twice" (diagnose() runs the rows for a finding that has one)
    eager_check: str | None = field(default=None, metadata=_INPUT)
    written: str | None = field(default=None, metadata=_INPUT)  # the expression the failing line writes ("w[0]")
    made_at: SourceLocation | None = field(default=None, metadata=_INPUT)  # the statement that bound `written`
    view_op: str | None = field(default=None, metadata=_INPUT)  # the op or Function that returned the written view
    # the nn class of the module whose parameter is written ("Embedding" for `embedding.weight[0] = 0`)
    owner_module: str | None = field(default=None, metadata=_INPUT)
    receiver: str | None = field(default=None, metadata=_INPUT)  # what the failing `.backward()` is called on
    carried: CarriedState | None = field(default=None, metadata=_INPUT)  # a loop variable that carries a graph
    carried_tensors: int | None = field(default=None, metadata=_INPUT)  # its length when it is a tuple or list
    # the same loss backpropagated twice: [the earlier backward's own call, the earlier path's statement, the
    # statement that backpropagates it again]
    same_loss: list[SourceLocation] | None = field(default=None, metadata=_INPUT)
    # the loss made once before the loop that backpropagates it: {"line", "code", "name", "first", "last"}
    forward_before_loop: dict[str, Any] | None = field(default=None, metadata=_INPUT)
    crossing: CrossingTensor | None = field(default=None, metadata=_INPUT)  # the tensor crossing into a freed graph
    # where a backward's tensor stopped being recorded: {"cause": "constant_gradient" | "reentrant_checkpoint",
    # "file", "line", "code", "call"} (backends/torch/no_graph.py)
    graph_cut: dict[str, Any] | None = field(default=None, metadata=_INPUT)
    # the loss accumulated across the earlier backward, lines: {"first", "again" (after it), "reset_before"}, and
    # "term" (what one step adds: `loss`) when the loop backpropagates its running sum in every step
    accumulation: dict[str, Any] | None = field(default=None, metadata=_INPUT)
    # -- rule inputs: a framework's words for rows whose core text speaks torch (the engine copies them from a probe
    # that has them: Paddle, MindSpore) --
    framework: str | None = field(default=None, metadata=_INPUT)  # how the user spells it: "Paddle", "MindSpore"
    direct_writers: str | None = field(default=None, metadata=_INPUT)  # who writes memory without its ops (a phrase)
    direct_write_fix: str | None = field(default=None, metadata=_INPUT)  # the fix for such a write
    optimizer_fix: str | None = field(default=None, metadata=_INPUT)  # the fix for a step no version counter saw
    leaf_words: tuple[str, str] | None = field(default=None, metadata=_INPUT)  # (why, fix) of a refused leaf write
    # -- JSON keys that are no field (NOTE [Facts]) --
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _NAMES:
            if getattr(self, name) is _UNSET:
                object.__setattr__(self, name, None)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if value is not _UNSET and name in _NAMES and name not in self._order:
            self._order.append(name)

    def _put(self, name: str, value: Any) -> None:
        if name in _NAMES:
            setattr(self, name, value)
        else:
            self.extra[name] = value
            if name not in self._order:
                self._order.append(name)

    def _items(self) -> Iterator[tuple[str, Any]]:
        extra = self.extra
        for name in self._order:
            if name in _NAMES:
                yield name, getattr(self, name)
            elif name in extra:
                yield name, extra[name]
        for name, value in extra.items():
            if name not in self._order:
                yield name, value

    def update(self, other: Facts) -> None:
        """Set every fact ``other`` sets, in its order (``dict.update``)."""
        for name, value in other._items():
            self._put(name, value)

    def to_dict(self) -> dict[str, Any]:
        """The JSON "context": the facts set, in the order they were set (NOTE [Facts])."""
        return dict(self._items())

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Facts:
        """Inverse of :meth:`to_dict`; a key that is no field goes to ``extra``."""
        facts = cls()
        for name, value in (data or {}).items():
            facts._put(name, value)
        return facts

    def __repr__(self) -> str:
        return "Facts(" + ", ".join(f"{name}={value!r}" for name, value in self._items()) + ")"


_NAMES = frozenset(f.name for f in dataclasses.fields(Facts) if not f.metadata.get("input")) - {"_order", "extra"}
