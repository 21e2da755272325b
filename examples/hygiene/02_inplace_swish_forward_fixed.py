"""The fix for 02: forward computes a new tensor (``x * torch.sigmoid(x)``), as timm kept it after #156."""

import torch


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_output * (s * (1 + x * (1 - s)))


torch.manual_seed(0)
conv = torch.nn.Conv2d(3, 4, 3)
images = torch.randn(2, 3, 8, 8)

features = Swish.apply(conv(images))
features.mean().backward()

expected = conv.weight.detach().clone().requires_grad_()
pre = torch.nn.functional.conv2d(images, expected, conv.bias.detach())
(pre * torch.sigmoid(pre)).mean().backward()
print("conv weight grad matches autograd's own swish:", torch.allclose(conv.weight.grad, expected.grad))
