"""The fix for 01: the residual add out of place (``h = h + Swish.apply(h)``); the tensor on ctx stays intact.

Saving it with ``ctx.save_for_backward(i)`` instead also helps: PyTorch then raises at the in-place add.
"""

import torch


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, i):
        ctx.save_for_backward(i)
        return i * torch.sigmoid(i)

    @staticmethod
    def backward(ctx, grad_output):
        (i,) = ctx.saved_tensors
        s = torch.sigmoid(i)
        return grad_output * (s * (1 + i * (1 - s)))


torch.manual_seed(0)
layer = torch.nn.Linear(8, 8)
x = torch.randn(4, 8)

h = layer(x)
h = h + Swish.apply(h)
h.pow(2).mean().backward()

expected = layer.weight.detach().clone().requires_grad_()
reference = x @ expected.t() + layer.bias.detach()
(reference + reference * torch.sigmoid(reference)).pow(2).mean().backward()
print("weight grad matches autograd's own swish:", torch.allclose(layer.weight.grad, expected.grad))
