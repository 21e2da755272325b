"""Activation offloading that deduplicates saved tensors by storage: a square transpose comes back untransposed.

From modelscope/ms-swift#10157 ("distinguish activation views during CPU offload"): the offload hooks keyed
their dedup on (storage address, dtype) and on reload only reshaped the shared copy, so "a tensor and its
transpose therefore share a CPU copy ... a square transpose silently uses the wrong activations in backward";
the fix keys on shape and strides too (huggingface/trl#6241 fixed a related storage-dedup bug). PyTorch does not
check what a user's unpack hook returns. This script prints the comparison with the gradient without the hooks.

    gradguard run examples/hygiene/09_offload_dedup_transposed_view_buggy.py
"""

import torch
from torch.autograd.graph import saved_tensors_hooks


class OffloadWithDedup(saved_tensors_hooks):
    def __init__(self):
        offloaded = {}

        def pack(t):
            key = (t.untyped_storage().data_ptr(), t.dtype)
            if key not in offloaded:
                offloaded[key] = t.detach().to("cpu", copy=True)
            return key, t.shape

        def unpack(packed):
            key, shape = packed
            return offloaded[key].reshape(shape)

        super().__init__(pack, unpack)


def step(hooks):
    torch.manual_seed(0)
    x = torch.randn(4, 4, requires_grad=True)
    w = torch.randn(4, 4, requires_grad=True)
    with hooks:
        h = x @ w
        gram = h @ h.t()  # saves h and its transpose: one storage
    gram.sum().backward()
    return w.grad


plain = step(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
print("gradient matches the run without offloading:", torch.allclose(step(OffloadWithDedup()), plain))
