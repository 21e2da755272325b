"""Lightning callback: every training batch runs under ``gradguard.guard()``.

    from gradguard.integrations.lightning import GradguardCallback
    trainer = lightning.pytorch.Trainer(callbacks=[GradguardCallback()])

The guard is entered in ``on_train_batch_start`` and left in ``on_train_batch_end``, so it covers the
forward, the backward and the optimizer step (Lightning runs them in between). A hazard raises gradguard's
error out of ``trainer.fit`` (the guard is left in ``on_exception``); ``callback.findings`` keeps every finding.
"""

from __future__ import annotations

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback

from .callback_core import StepCallback

__all__ = ["GradguardCallback"]


class GradguardCallback(StepCallback, Callback):
    """Run each training batch under ``gradguard.guard`` (arguments: :class:`.callback_core.StepCallback`)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._steps.begin()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._steps.end()

    def on_exception(self, trainer, pl_module, exception):
        self._steps.fail(exception)
