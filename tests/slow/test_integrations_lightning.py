"""The Lightning callback with real Lightning: a tiny model built here, trained on CPU for a few steps."""

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gradguard
from gradguard.integrations.lightning import GradguardCallback
from gradguard.report import render_finding



class Tiny(pl.LightningModule):
    def __init__(self, buggy: bool):
        super().__init__()
        self.buggy = buggy
        self.layer = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = torch.sigmoid(self.layer(x))
        if self.buggy:
            h += 1  # the bug: sigmoid saved h for backward
        else:
            h = h + 1
        return nn.functional.mse_loss(self.head(h), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(module, callback, tmp_path):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = pl.Trainer(
        max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=[callback],
    )
    trainer.fit(module, DataLoader(data, batch_size=4))
    return trainer


def _assert_guard_left():
    # Outside any guard, PyTorch's own check is back: a plain RuntimeError, not gradguard's.
    x = torch.ones(2, requires_grad=True)
    y = torch.sigmoid(x)
    y.mul_(2)
    with pytest.raises(RuntimeError) as info:
        y.sum().backward()
    assert not isinstance(info.value, gradguard.GradguardError)
    assert "modified by an inplace operation" in str(info.value)


def test_lightning_callback_turns_the_bug_into_a_diagnosis(tmp_path):
    callback = GradguardCallback(mode="forensic")  # the writer's line from the first step
    with pytest.raises(gradguard.InplaceModificationError) as info:
        _fit(Tiny(buggy=True), callback, tmp_path)
    finding = info.value.finding
    assert [f is finding for f in callback.findings] == [True]
    assert finding.rule == "augmented_assignment"
    assert finding.saved_at.op == "SigmoidBackward0.result"
    assert finding.saved_at.location.code == "h = torch.sigmoid(self.layer(x))"
    assert [w.location.code for w in finding.modified_at] == ["h += 1  # the bug: sigmoid saved h for backward"]
    assert finding.modified_at[0].location.function == "training_step"
    # The user sees the whole diagnosis in the exception that comes out of trainer.fit.
    # PyTorch's own sentence first (existing `match=` checks keep passing), then gradguard's diagnosis.
    assert str(info.value).startswith("one of the variables needed for gradient computation has been modified by "
                                      "an inplace operation: ")
    assert str(info.value).endswith("\n\ngradguard: " + render_finding(finding))
    assert "\n  fix         : Write it out of place" in str(info.value)
    _assert_guard_left()


def test_lightning_callback_is_silent_on_correct_training(tmp_path):
    callback = GradguardCallback(fingerprint="sample")
    module = Tiny(buggy=False)
    before = module.layer.weight.detach().clone()
    trainer = _fit(module, callback, tmp_path)
    assert trainer.global_step == 3
    assert callback.findings == []
    assert not torch.equal(before, module.layer.weight.detach())  # it really trained
    _assert_guard_left()


def test_lightning_callback_validates_its_arguments():
    with pytest.raises(gradguard.InvalidArgument) as info:
        GradguardCallback(fingerprint="fast")
    assert str(info.value) == "guard(fingerprint=...) must be one of 'full', 'sample', 'off'; got 'fast'"
