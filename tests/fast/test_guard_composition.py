"""The guard composes with the user's own saved-tensor hooks (issue 11 point 3): stacked, never replaced, in
both nestings; gradients bit-identical to the same program without gradguard; what comes back through the
user's hooks is still checked."""

import pytest
import torch
from torch.autograd.graph import save_on_cpu, saved_tensors_hooks

import gradguard
from gradguard.backends.torch.user_hooks import TOP_HOOKS

# torch 2.4 cannot hand a guard the user's hooks entered before it: the guard steps aside for saved tensors
# there (one NotWatched line) instead of replacing them (NOTE in backends/torch/user_hooks.py).
UNLISTABLE = TOP_HOOKS is None


class Compress:
    """bf16 compression hooks that count their calls (a copy: later writes cannot reach it)."""

    def __init__(self):
        self.packs = self.unpacks = 0

    def pack(self, t):
        self.packs += 1
        return t.to(torch.bfloat16), t.dtype

    def unpack(self, packed):
        self.unpacks += 1
        return packed[0].to(packed[1])


class KeepReference:
    """Hooks that keep the tensor itself (dedup by storage does this): a later in-place write reaches backward."""

    def pack(self, t):
        return t

    def unpack(self, t):
        return t


def _program(buggy=False):
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)
    h = torch.sigmoid(x @ w)
    if buggy:
        h.mul_(2)  # sigmoid saved h for backward
    (h * h).sum().backward()
    return w.grad


def _run(nesting, hooks, buggy=False):
    if nesting == "hooks outside the guard":
        with saved_tensors_hooks(hooks.pack, hooks.unpack), gradguard.guard():
            return _program(buggy)
    with gradguard.guard(), saved_tensors_hooks(hooks.pack, hooks.unpack):
        return _program(buggy)


NESTINGS = ["hooks outside the guard", "hooks inside the guard"]


@pytest.mark.parametrize("nesting", NESTINGS)
def test_user_hooks_keep_running_and_gradients_are_bit_identical(nesting):
    plain_hooks = Compress()
    with saved_tensors_hooks(plain_hooks.pack, plain_hooks.unpack):
        expected = _program()
    hooks = Compress()
    got = _run(nesting, hooks)
    assert (hooks.packs, hooks.unpacks) == (plain_hooks.packs, plain_hooks.unpacks) == (4, 4)
    assert torch.equal(got, expected)
    # the compressed values really were used: not the full-precision gradient
    assert not torch.equal(got, _program())


@pytest.mark.parametrize("nesting", NESTINGS)
def test_save_on_cpu_composes(nesting):
    with save_on_cpu():
        expected = _program()
    if nesting == "hooks outside the guard":
        with save_on_cpu(), gradguard.guard():
            got = _program()
    else:
        with gradguard.guard(), save_on_cpu():
            got = _program()
    assert torch.equal(got, expected)


@pytest.mark.parametrize("nesting", NESTINGS)
def test_a_write_that_reaches_backward_through_user_hooks_is_caught(nesting):
    if UNLISTABLE and nesting == "hooks outside the guard":
        with pytest.warns(gradguard.NotWatched, match="torch < 2.5 cannot show them to gradguard"):
            _run(nesting, KeepReference(), buggy=True)  # unwatched: runs exactly as without gradguard
        return
    with pytest.raises(gradguard.SilentModificationError) as info:
        _run(nesting, KeepReference(), buggy=True)
    finding = info.value.finding
    assert finding.saved_at.location.code == "h = torch.sigmoid(x @ w)"
    assert any("came back from your saved_tensors_hooks unpack different" in note for note in finding.notes)


@pytest.mark.parametrize("nesting", NESTINGS)
def test_copying_hooks_make_the_write_harmless_and_the_guard_says_nothing(nesting):
    # bf16 copies taken at save time: backward uses the values the forward used, so the gradient is right and
    # there is nothing to report (plain PyTorch gives the same gradient).
    plain_hooks = Compress()
    with saved_tensors_hooks(plain_hooks.pack, plain_hooks.unpack):
        expected = _program(buggy=True)
    assert torch.equal(_run(nesting, Compress(), buggy=True), expected)


def test_checkpointing_composes_with_the_guard():
    from torch.utils.checkpoint import checkpoint

    def program():
        torch.manual_seed(0)
        w = torch.randn(4, 4, requires_grad=True)
        x = torch.randn(3, 4, requires_grad=True)
        y = checkpoint(lambda a: torch.tanh(a @ w).exp(), x, use_reentrant=False)
        y.sum().backward()
        return w.grad, x.grad

    expected = program()
    with gradguard.guard():
        got = program()
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


class DedupByStorage:
    """Offloading that deduplicates by storage alone (modelscope/ms-swift#10157): a tensor and its transpose
    share one copy, so the transpose comes back untransposed."""

    def __init__(self):
        self.copies = {}

    def pack(self, t):
        key = (t.untyped_storage().data_ptr(), t.dtype)
        self.copies.setdefault(key, t.detach().clone())
        return key, t.shape

    def unpack(self, packed):
        key, shape = packed
        return self.copies[key].reshape(shape)


@pytest.mark.parametrize("mode", [dict(), dict(fingerprint="sample", track_writes=False)], ids=["forensic", "sentinel"])
def test_an_unpack_returning_another_view_is_named_as_such(mode):
    hooks = DedupByStorage()
    with pytest.raises(gradguard.SilentModificationError) as info:
        with gradguard.guard(**mode), saved_tensors_hooks(hooks.pack, hooks.unpack):
            h = torch.randn(4, 4, requires_grad=True) * 2
            (h @ h.t()).sum().backward()
    finding = info.value.finding
    assert finding.rule == "user_hooks_round_trip"
    assert finding.facts.user_hooks == "layout" and finding.facts.writer_unknowable is True
    assert sorted([finding.facts.packed["strides"], finding.facts.unpacked["strides"]]) == [[1, 4], [4, 1]]
    assert "storage offset, shape, strides" in finding.suggestion
    assert not any("write tracking was off" in note for note in finding.notes)
