"""TransformerEngine's Triton cross entropy, unreduced loss: the backward scales every token by grad_output[0].

Report: https://github.com/NVIDIA/TransformerEngine/pull/2139 ("fix cross entropy vanishing gradients"; also
https://github.com/ROCm/TransformerEngine/pull/336: "if reduce_loss=False, grad_output is a tensor, not a scalar.
We need to load 1 value per row instead of just a scalar").
Fix:    commit e9a5fa4 (``grad_output_ptr += program_id * grad_output_stride``).
Code:   transformer_engine/pytorch/triton/cross_entropy.py at e9a5fa4^ and e9a5fa4 (Apache-2.0), verbatim in
_te_cross_entropy_before_fix.py / _te_cross_entropy_after_fix.py; CrossEntropyFunction from
transformer_engine/pytorch/cross_entropy.py at e9a5fa4^, verbatim. reduce_loss=False is TE's default.
"""

import importlib.util
import os

import torch
import torch.nn.functional as F

CASE = {
    "library": "TransformerEngine 2.6",
    "kind": "backward (Triton)",
    "report": "https://github.com/NVIDIA/TransformerEngine/pull/2139",
    "fix": "https://github.com/NVIDIA/TransformerEngine/commit/e9a5fa4e3",
    "code": "verbatim Triton module at e9a5fa4^ and e9a5fa4, autograd Function verbatim",
    "root_cause": ("gradient.numerical", "gradient.reference", "gradient.cotangent_linearity"),
    "without_reference": "caught",
    # Both versions write the gradient into the logits they were given (the design TE took from Liger-Kernel):
    # a second backward and ops upstream that saved the logits see gradients, not logits.
    "known_defects": ("mutation.silent_input_write", "mutation.backward_not_repeatable", "composition."),
}


def _load(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cross_entropy_function(triton_cross_entropy):
    class CrossEntropyFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, _input, target, label_smoothing=0.0, reduce_loss=False, dist_process_group=None, ignore_idx=-100,
                    is_cg_capturable=False):
            loss, _input = triton_cross_entropy.cross_entropy_forward(
                _input, target, label_smoothing, reduce_loss, dist_process_group, ignore_idx)
            ctx.save_for_backward(_input.detach())
            ctx.is_cg_capturable = is_cg_capturable
            return loss

        @staticmethod
        def backward(ctx, grad_output):
            (_input,) = ctx.saved_tensors
            _input = triton_cross_entropy.cross_entropy_backward(_input, grad_output, ctx.is_cg_capturable)
            return (_input, None, None, None, None, None, None)

    return CrossEntropyFunction


_Buggy = _cross_entropy_function(_load("_te_cross_entropy_before_fix"))
_Fixed = _cross_entropy_function(_load("_te_cross_entropy_after_fix"))


def buggy(logits, target):
    return _Buggy.apply(logits, target)


def fixed(logits, target):
    return _Fixed.apply(logits, target)


def reference(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none").reshape(target.shape)


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 4, 16, generator=g), torch.randint(0, 16, (2, 4), generator=g)


OPTIONS = {}
