"""The training callbacks' step guard starts in the cheap sentinel and switches to forensic after a finding
(issue 17: a callback you can leave on). Driven here by a plain loop; Lightning and Hugging Face runs are in
tests/slow/test_integrations_*.py."""

import pytest
import torch

import gradguard
from gradguard.integrations.callback_core import StepGuard


def _step(steps: StepGuard, buggy: bool):
    steps.begin()
    try:
        x = torch.randn(3, requires_grad=True)
        h = torch.sigmoid(x)
        if buggy:
            h *= 2
        h.sum().backward()
    except BaseException as error:
        raise (steps.fail(error) or error)
    steps.end()


def test_auto_runs_the_sentinel_until_a_finding_then_forensic():
    steps = StepGuard()
    _step(steps, buggy=False)
    assert steps._active is None and steps.current_mode == "sentinel"
    steps.begin()
    assert (steps._active.fingerprint, steps._active.track_writes) == ("sample", False)
    steps.end()
    with pytest.raises(gradguard.InplaceModificationError) as info:
        _step(steps, buggy=True)
    first = info.value.finding
    # The sentinel still names the tensor and the saver; it cannot name the writer, and says how to get it.
    assert first.saved_at.location.code == "h = torch.sigmoid(x)"
    assert first.modified_at == []
    assert first.notes[-1].startswith("the callback ran this step in the cheap sentinel mode (no write log)")
    assert "GradguardCallback(mode='forensic')" in first.notes[-1]
    assert steps.current_mode == "forensic"
    with pytest.raises(gradguard.InplaceModificationError) as again:
        _step(steps, buggy=True)
    assert [w.location.code for w in again.value.finding.modified_at] == ["h *= 2"]
    assert steps.findings == [first, again.value.finding]


def test_forensic_names_the_writer_from_the_first_step_and_sentinel_never_switches():
    forensic = StepGuard(mode="forensic")
    with pytest.raises(gradguard.InplaceModificationError) as info:
        _step(forensic, buggy=True)
    assert [w.location.code for w in info.value.finding.modified_at] == ["h *= 2"]
    sentinel = StepGuard(mode="sentinel")
    for _ in range(2):
        with pytest.raises(gradguard.InplaceModificationError) as info:
            _step(sentinel, buggy=True)
        assert info.value.finding.modified_at == []
    assert sentinel.current_mode == "sentinel"


def test_explicit_options_override_the_mode_and_bad_mode_is_named():
    steps = StepGuard(fingerprint="full")
    steps.begin()
    assert (steps._active.fingerprint, steps._active.track_writes) == ("full", False)
    steps.end()
    with pytest.raises(gradguard.InvalidArgument) as info:
        StepGuard(mode="fast")
    assert str(info.value) == "GradguardCallback(mode=...) must be one of 'auto', 'sentinel', 'forensic'; got 'fast'"
