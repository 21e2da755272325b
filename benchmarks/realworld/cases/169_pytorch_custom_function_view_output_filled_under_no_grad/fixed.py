# Reproduction of https://github.com/pytorch/pytorch/issues/14707 (a PyTorch issue: a custom autograd.Function whose
# forward computes through numpy and returns torch.tensor(z).view(-1), a view, and the user then fills that output in
# place under torch.no_grad(); in 2018 the custom backward was silently skipped and x.grad stayed None, current
# PyTorch refuses the backward because the in-place write would override the custom backward of a view created
# inside a custom Function. The snippet as written, seeded).
import torch
from torch.autograd import Function

torch.manual_seed(0)


class Mul3ThenFlatten(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        z = x.detach().numpy() * 3
        # If I add a .contiguous() to the end of this statement, other things happen.
        return torch.tensor(z).view(-1).clone()

    @staticmethod
    def backward(ctx, dx):
        x = ctx.saved_tensors[0]
        print("Some side effect")
        return dx.view(x.shape) * 3


x = torch.randn(2, 2, requires_grad=True)
output = Mul3ThenFlatten.apply(x)

# Modify the counter in no_grad mode.
with torch.no_grad():
    output.fill_(1)

# Doesn't print "Some side effect" :/
output.sum().backward()

x.grad  # is None, should really be something or at least an assert
print(x.grad)
