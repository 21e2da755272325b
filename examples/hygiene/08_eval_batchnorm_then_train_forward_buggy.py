"""A BatchNorm output computed in eval mode, then a training-mode forward, then backward through the first.

From pytorch/pytorch#13402 ("batch_norm doesn't bump version counter in running stats", open): the eval-mode
forward normalises with ``running_mean``/``running_var`` and its backward reads them again; the train-mode
forward in between updates them in place without moving their version counter, so backward silently uses the
new statistics (zou3519 in #120622: "hi-pri for potential silent incorrectness"). The report's workaround:
clone the running buffers before the train-mode forward. This script prints the comparison with the gradient
taken before the statistics change.

    gradguard run examples/hygiene/08_eval_batchnorm_then_train_forward_buggy.py
"""

import torch
from torch import nn

torch.manual_seed(0)
bn = nn.BatchNorm1d(4)
bn.running_var.fill_(2.0)
x = torch.randn(8, 4, requires_grad=True)
batch = torch.randn(8, 4) * 3

bn.eval()
y0 = bn(x)  # normalised with the running statistics
bn.train()
bn(batch)  # a training forward updates running_mean/running_var in place
y0.square().sum().backward()

x_ref = x.detach().clone().requires_grad_()
scale = bn.weight.detach() / torch.sqrt(torch.full((4,), 2.0) + bn.eps)
((x_ref - 0.0) * scale + bn.bias.detach()).square().sum().backward()
print("gradient uses the statistics of its forward:", torch.allclose(x.grad, x_ref.grad))
