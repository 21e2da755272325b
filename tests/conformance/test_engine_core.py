"""The guard engine's framework-neutral parts (run in the torch venv): one "sample" fingerprint definition
shared by every backend, typed events, and a core that imports no framework and no renderer."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from gradguard.backends.torch.fingerprint import fingerprint as torch_fingerprint
from gradguard.core.engine import SAMPLE_BYTES, fingerprint_bytes, sample_spans
from gradguard.core.events import BackwardEnded, TensorSaved, TensorWritten


def test_sample_spans_cover_both_ends_in_16_chunks_of_4_kib():
    n = 10 * SAMPLE_BYTES + 3
    spans = sample_spans(n)
    assert len(spans) == 16 and all(e - s == 4096 for s, e in spans)
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # disjoint, increasing
    assert sample_spans(SAMPLE_BYTES) == ((0, SAMPLE_BYTES),)  # small tensors are hashed whole


@pytest.mark.parametrize("numel", [7, SAMPLE_BYTES // 4, 3 * SAMPLE_BYTES + 5])
@pytest.mark.parametrize("mode", ["full", "sample"])
def test_torch_fingerprint_equals_the_core_definition_used_by_paddle_and_mindspore(numel, mode):
    t = torch.arange(numel, dtype=torch.float32)
    assert torch_fingerprint(t, mode) == fingerprint_bytes(t.numpy(), mode)


def test_sample_mode_sees_a_write_inside_the_sample_and_not_between_chunks():
    a = np.zeros(4 * SAMPLE_BYTES, dtype=np.uint8)
    base = fingerprint_bytes(a, "sample")
    start, end = sample_spans(a.nbytes)[1]
    a[end + 10] = 1  # between two chunks: "sample" does not see it, "full" does
    assert fingerprint_bytes(a, "sample") == base and fingerprint_bytes(a, "full") != fingerprint_bytes(
        np.zeros_like(a), "full")
    a[start] = 1
    assert fingerprint_bytes(a, "sample") != base


def test_events_are_slotted_dataclasses():
    # slotted, not frozen: one is built per saved tensor (NOTE [Why slotted, not frozen, dataclasses])
    event = TensorWritten(target=None, op="paddle.Tensor.add_", category="other", location=None,
                          version_before=0, version_after=1)
    assert dataclasses.is_dataclass(event) and not hasattr(event, "__dict__")
    with pytest.raises(AttributeError):
        event.not_a_field = 1
    assert BackwardEnded(None).failed is False and TensorSaved(None, None).saver is None


def test_engine_and_events_import_no_framework():
    # Renderers are loaded by the top-level package (which registers them), never by core: core's sources are
    # read for such imports in tests/fast/test_core_neutral.py.
    code = ("import json, sys\nimport gradguard.core.engine, gradguard.core.events\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'paddle', 'mindspore'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_torch_guard_runs_on_the_core_engine_and_emits_typed_events():
    import gradguard
    from gradguard.core.engine import GuardEngine
    from gradguard.core.events import BackwardStarted, TensorUnpacked

    seen = []
    x = torch.randn(4, requires_grad=True)
    block = gradguard.guard()
    with pytest.raises(gradguard.InplaceModificationError) as info:
        with block:
            engine = block.session.engine
            assert isinstance(engine, GuardEngine)
            engine.subscribers.append(lambda event: seen.append(type(event)))
            y = x.exp()
            y.add_(1)
            y.sum().backward()
    kinds = [k for k in seen]
    assert kinds[:3] == [TensorSaved, TensorWritten, BackwardStarted] and kinds[-1] is TensorUnpacked
    # the engine raised the finding it assembled: the error's finding is the one the engine keeps
    assert engine.findings == [info.value.finding]
    assert info.value.finding.modified_at[0].location.code == "y.add_(1)"
    assert info.value.finding.modified_at[0].version_before == 0 and info.value.finding.modified_at[0].version_after == 1


@pytest.mark.parametrize("backend", ["torch", "paddle", "mindspore"])
def test_backend_probes_hold_no_copy_of_the_pipeline(backend):
    # records, the ledger, the unpack check, finding assembly and raising live in core/engine.py only
    import pathlib

    import gradguard

    source = (pathlib.Path(gradguard.__file__).parent / "backends" / backend / "session.py").read_text()
    for piece in ("SavedLedger(", "error_for", "diagnose(", "Finding(", "class _SavedRecord", "raise error"):
        assert piece not in source, f"{backend}'s probe still has {piece!r}"


def test_write_log_and_bisect_subscribe_to_one_dispatch_mode():
    import gradguard
    from gradguard.backends.torch.bisect import Bisector
    from gradguard.backends.torch.writes import OpStream, WriteLog
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    with gradguard.guard(bisect=True):
        stack = _get_current_dispatch_mode_stack()
        ours = [m for m in stack if isinstance(m, OpStream)]
        assert len(ours) == 1 and len(stack) == 1
        assert [type(s) for s in ours[0].subscribers] == [Bisector, WriteLog]  # bisect outermost
    assert _get_current_dispatch_mode_stack() == []


def test_foreach_version_bump_is_repaired_once_for_every_subscriber():
    # under any Python dispatch mode torch skips the _foreach_ version bump; the op stream restores it
    import gradguard

    params = [torch.zeros(3), torch.zeros(2)]
    with gradguard.guard():
        torch._foreach_add_(params, 1.0)
    assert [p._version for p in params] == [1, 1]
