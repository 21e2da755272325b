# Reproduction of https://github.com/pytorch/pytorch/issues/24413 (snippet as reported; current PyTorch rejects the in-place op).
import torch

torch.manual_seed(0)


class f(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor1):
        # make sure we don't share storage with our input
        # (just to be clear that that's not what's going wrong)
        tensor2 = tensor1.clone()
        # tensor3 shares storage with tensor2
        # tensor3 = tensor2.view(-1) etc. would also demonstrate the problem
        tensor3 = tensor2.t()
        ctx.save_for_backward(tensor3)
        return tensor3

    @staticmethod
    def backward(ctx, grad):
        # trigger correctness check
        _ = ctx.saved_tensors
        return grad.t().clone()


x = torch.rand(2, 3, requires_grad=True)
y = f.apply(x)
y = y + 1
# Does not raise an error; this is the bug.
y.backward(torch.rand_like(y))
