"""Hugging Face ``Trainer`` callback: every optimizer step runs under ``gradguard.guard()``.

    from gradguard.integrations.huggingface import GradguardCallback
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[GradguardCallback()])

The guard is entered in ``on_step_begin`` and left in ``on_step_end``: it covers every micro-batch's forward
and backward (gradient accumulation included) and the optimizer step. ``TrainerCallback`` has no exception
hook, so in ``on_train_begin`` the callback wraps this trainer's ``training_step`` to leave the guard when a
step raises; gradguard's error then comes out of ``trainer.train()`` and ``callback.findings`` keeps it.
"""

from __future__ import annotations

import functools
import sys

from transformers import Trainer, TrainerCallback

from .callback_core import StepCallback

__all__ = ["GradguardCallback"]


def _calling_trainer() -> Trainer | None:
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


class GradguardCallback(StepCallback, TrainerCallback):
    """Run each training step under ``gradguard.guard`` (arguments: :class:`.callback_core.StepCallback`)."""

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = _calling_trainer()
        if trainer is None or getattr(trainer.training_step, "_gradguard_wrapped", False):
            return
        original = trainer.training_step
        steps = self._steps

        @functools.wraps(original)
        def training_step(*a, **k):
            try:
                return original(*a, **k)
            except BaseException as error:
                enriched = steps.fail(error)  # None where no step is open
                if enriched is not None:
                    raise enriched.with_traceback(error.__traceback__) from error
                raise

        training_step._gradguard_wrapped = True
        trainer.training_step = training_step

    def on_step_begin(self, args, state, control, **kwargs):
        self._steps.begin()

    def on_step_end(self, args, state, control, **kwargs):
        self._steps.end()
