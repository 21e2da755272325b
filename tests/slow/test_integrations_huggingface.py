"""The Hugging Face Trainer callback with real transformers: a tiny BERT built from a config here (no hub
download), trained on CPU for a few steps with gradient accumulation."""

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import gradguard
from gradguard.integrations.huggingface import GradguardCallback
from gradguard.report import render_finding


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n=16):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 60, (n, 8), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": self.labels[i]}


def _tiny_bert():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    return BertForSequenceClassification(config)


def _train(model, callback, tmp_path, steps=2):
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        learning_rate=1e-2, use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Pairs(), callbacks=[callback])
    trainer.train()
    return trainer


def _clamp_in_place(module, inputs, output):
    output.clamp_(-0.9, 0.9)  # the bug: Tanh saved its output for backward


def test_trainer_callback_turns_the_bug_into_a_diagnosis(tmp_path):
    model = _tiny_bert()
    # A forward hook that clamps the pooler's Tanh output in place: tanh's backward needs that output.
    model.bert.pooler.activation.register_forward_hook(_clamp_in_place)
    callback = GradguardCallback(mode="forensic")  # the writer's line from the first step
    with pytest.raises(gradguard.InplaceModificationError) as info:
        _train(model, callback, tmp_path)
    finding = info.value.finding
    assert [f is finding for f in callback.findings] == [True]
    assert finding.saved_at.op == "TanhBackward0.result"
    # named by the hook's parameter that held it where it was written (no variable holds it when backward fails)
    assert finding.tensor.label == "output (float32[4, 16], output of TanhBackward0)"
    assert [w.op for w in finding.modified_at] == ["aten.clamp_"]
    assert [w.location.code for w in finding.modified_at] == [
        "output.clamp_(-0.9, 0.9)  # the bug: Tanh saved its output for backward"]
    # PyTorch's own sentence first (existing `match=` checks keep passing), then gradguard's diagnosis.
    assert str(info.value).startswith("one of the variables needed for gradient computation has been modified by "
                                      "an inplace operation: ")
    assert str(info.value).endswith("\n\ngradguard: " + render_finding(finding))
    # The guard was left when the step failed: PyTorch's own check is back.
    x = torch.ones(2, requires_grad=True)
    y = torch.tanh(x)
    y.mul_(2)
    with pytest.raises(RuntimeError) as plain:
        y.sum().backward()
    assert not isinstance(plain.value, gradguard.GradguardError)


def test_trainer_callback_is_silent_on_correct_training(tmp_path):
    model = _tiny_bert()
    before = model.classifier.weight.detach().clone()
    callback = GradguardCallback(fingerprint="sample")
    trainer = _train(model, callback, tmp_path)
    assert trainer.state.global_step == 2
    assert callback.findings == []
    assert not callback._steps.active
    assert not torch.equal(before, model.classifier.weight.detach())  # it really trained
