# Renormalising a weight through `.data` between the forward pass and backward. `.data` has its own
# version counter, so PyTorch raises nothing and the gradient w.r.t. the input uses the new weight:
# silently wrong. gradguard's fingerprint sees the bytes change (SilentModificationError).
import torch
from torch import nn

torch.manual_seed(0)
layer = nn.Linear(4, 4, bias=False)
x = torch.randn(3, 4, requires_grad=True)
out = layer(x)
layer.weight.data /= layer.weight.data.norm()
out.pow(2).sum().backward()
print(f"grad norm={x.grad.norm().item():.4f}")
