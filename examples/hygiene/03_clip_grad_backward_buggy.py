"""A gradient-clipping Function whose backward clamps ``grad_output`` in place, on a residual branch.

The residual add hands one gradient tensor to both the skip path and the branch; the branch's backward
clamps it in place, so the skip path (which runs later) gets the clamped gradient too. The mechanism, as
maintainers describe it: pytorch/pytorch#46168 ("A common case where the gradients are views is z=x+y ...
gradients of x and y would be referencing the same storage"), mapillary/inplace_abn#146 ("the same copy is
passed to another backward branch"), NVIDIA/apex#1430 and #1587 (fused softmax backward kernels that write
into the incoming gradient; fixed in apex#1444). No error from PyTorch: the skip path's gradient is silently
clipped (this script prints the comparison).

    gradguard run examples/hygiene/03_clip_grad_backward_buggy.py
"""

import torch


class ClipGrad(torch.autograd.Function):
    """Identity forward; backward clips the gradient to [-limit, limit]."""

    @staticmethod
    def forward(ctx, x, limit):
        ctx.limit = limit
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.clamp_(-ctx.limit, ctx.limit), None


torch.manual_seed(0)
stem = torch.nn.Linear(6, 6)
branch = torch.nn.Linear(6, 6)
x = torch.randn(5, 6)

h = stem(x)
out = h + ClipGrad.apply(branch(h), 0.01)
(out * 10).sum().backward()

# the same step with an out-of-place clip: what the gradient should be
stem_ref, branch_ref = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)
stem_ref.load_state_dict(stem.state_dict())
branch_ref.load_state_dict(branch.state_dict())
h_ref = stem_ref(x)
update = branch_ref(h_ref)
update.register_hook(lambda grad: grad.clamp(-0.01, 0.01))
(h_ref + update).mul(10).sum().backward()
print("stem grad matches an out-of-place clip:", torch.allclose(stem.weight.grad, stem_ref.weight.grad))
