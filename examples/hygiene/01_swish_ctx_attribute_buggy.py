"""A memory-efficient Swish that keeps its input on ``ctx`` instead of ``save_for_backward``.

Pattern: PyTorch's ``FunctionCtx.save_for_backward`` documentation ("All tensors intended to be used in the
backward pass should be saved with save_for_backward (as opposed to directly on ctx) to prevent incorrect
gradients and memory leaks"); pyro-ppl/pyro#1049 ("never write `ctx.blah = blah`"); pytorch/pytorch#58509.
A residual block adds the activation back in place, which rewrites the tensor the backward reads through
``ctx.i``. PyTorch checks nothing here: the gradient is silently wrong (this script prints both).

    gradguard run examples/hygiene/01_swish_ctx_attribute_buggy.py
"""

import torch


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, i):
        ctx.i = i
        return i * torch.sigmoid(i)

    @staticmethod
    def backward(ctx, grad_output):
        s = torch.sigmoid(ctx.i)
        return grad_output * (s * (1 + ctx.i * (1 - s)))


torch.manual_seed(0)
layer = torch.nn.Linear(8, 8)
x = torch.randn(4, 8)

h = layer(x)
h += Swish.apply(h)
h.pow(2).mean().backward()

expected = layer.weight.detach().clone().requires_grad_()
reference = x @ expected.t() + layer.bias.detach()
(reference + reference * torch.sigmoid(reference)).pow(2).mean().backward()
print("weight grad matches autograd's own swish:", torch.allclose(layer.weight.grad, expected.grad))
