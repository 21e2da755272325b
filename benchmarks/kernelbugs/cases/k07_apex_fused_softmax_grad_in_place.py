"""NVIDIA Apex's fused scaled-masked softmax: the backward writes the input gradient over the incoming gradient.

Report: https://github.com/NVIDIA/apex/issues/1430 ("fused_softmax kernel modifies input_grad tensor during
backward step calculation": ``dispatch_scaled_masked_softmax_backward`` is launched with ``output_grads_ptr`` as
both its output and its input, against PyTorch's rule that a backward never modifies its arguments in place).
Fix:    https://github.com/NVIDIA/apex/pull/1444 ("avoiding inplace operation in bwd pass": the result goes to
a new tensor). The same pattern stayed in other Apex kernels (https://github.com/NVIDIA/apex/issues/1587).
Code:   re-expressed in PyTorch from csrc/megatron/scaled_masked_softmax.h/.cu (the CUDA kernel does not run on
CPU): forward ``softmax(scale * x)`` with masked entries at -10000, backward ``scale * y * (g - sum(g * y))``
stored through the gradient's raw memory (``.data``: a CUDA kernel does not bump the version counter).
"""

import torch

CASE = {
    "library": "NVIDIA Apex (2022)",
    "kind": "backward (CUDA kernel, re-expressed)",
    "report": "https://github.com/NVIDIA/apex/issues/1430",
    "fix": "https://github.com/NVIDIA/apex/pull/1444",
    "code": "re-expressed in PyTorch from the CUDA kernel",
    # the values are right: only the write into the incoming gradient shows it
    "root_cause": ("mutation.grad_output_write",),
    "without_reference": "caught",
    "known_defects": (),
}

SCALE = 0.5


def _scaled_masked_softmax_function(in_place):
    class ScaledMaskedSoftmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inputs, mask, scale):
            scale_t = torch.tensor([scale])
            softmax_results = torch.softmax((inputs * scale).masked_fill(mask, -10000.0), dim=-1)
            ctx.save_for_backward(softmax_results, scale_t)
            return softmax_results

        @staticmethod
        def backward(ctx, output_grads):
            softmax_results, scale_t = ctx.saved_tensors
            dot = (output_grads * softmax_results).sum(-1, keepdim=True)
            result = scale_t.item() * softmax_results * (output_grads - dot)
            if in_place:  # gradInput and grad are the same pointer
                output_grads.data.copy_(result)
                return output_grads, None, None
            return result, None, None

    return ScaledMaskedSoftmax


_Buggy, _Fixed = _scaled_masked_softmax_function(True), _scaled_masked_softmax_function(False)


def buggy(inputs, mask):
    return _Buggy.apply(inputs, mask, SCALE)


def fixed(inputs, mask):
    return _Fixed.apply(inputs, mask, SCALE)


def reference(inputs, mask):
    return torch.softmax((inputs * SCALE).masked_fill(mask, -10000.0), dim=-1)


def inputs():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 4, 4, generator=g)  # (batch, heads, query, key)
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1).expand(2, 1, 4, 4).contiguous()  # causal
    return scores, mask


OPTIONS = {}
