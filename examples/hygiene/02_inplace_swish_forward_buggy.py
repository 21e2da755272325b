"""An in-place Swish Function: forward multiplies its input in place and does not call ``ctx.mark_dirty``.

From huggingface/pytorch-image-models#156 ("makes swish and mish inplace by default and saves a lot of
memory"); the maintainer's review: "it's not correct. If you modify x in-place in forward, you need to clone x
before saving for backward ... it won't converge very well". Same family: ultralytics/yolov3#441
(``x.mul_(torch.sigmoid(x))`` "also changes its input"). The backward reads the overwritten input: silently
wrong gradients (this script prints the comparison).

    gradguard run examples/hygiene/02_inplace_swish_forward_buggy.py
"""

import torch


class SwishInplace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.mul_(torch.sigmoid(x))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_output * (s * (1 + x * (1 - s)))


torch.manual_seed(0)
conv = torch.nn.Conv2d(3, 4, 3)
images = torch.randn(2, 3, 8, 8)

features = SwishInplace.apply(conv(images))
features.mean().backward()

expected = conv.weight.detach().clone().requires_grad_()
pre = torch.nn.functional.conv2d(images, expected, conv.bias.detach())
(pre * torch.sigmoid(pre)).mean().backward()
print("conv weight grad matches autograd's own swish:", torch.allclose(conv.weight.grad, expected.grad))
