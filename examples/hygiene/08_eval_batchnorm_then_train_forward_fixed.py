"""The fix for 08: the eval-mode output's backward runs before the training-mode forward updates the statistics."""

import torch
from torch import nn

torch.manual_seed(0)
bn = nn.BatchNorm1d(4)
bn.running_var.fill_(2.0)
x = torch.randn(8, 4, requires_grad=True)
batch = torch.randn(8, 4) * 3

bn.eval()
y0 = bn(x)  # normalised with the running statistics
y0.square().sum().backward()  # backward before the statistics change
bn.train()
bn(batch)

x_ref = x.detach().clone().requires_grad_()
scale = bn.weight.detach() / torch.sqrt(torch.full((4,), 2.0) + bn.eps)
((x_ref - 0.0) * scale + bn.bias.detach()).square().sum().backward()
print("gradient uses the statistics of its forward:", torch.allclose(x.grad, x_ref.grad))
