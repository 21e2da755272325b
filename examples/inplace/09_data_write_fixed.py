# Fixed: renormalise after the backward that needs the old weight, under torch.no_grad() instead of
# through `.data`, so autograd's version check would see any conflicting write.
import torch
from torch import nn

torch.manual_seed(0)
layer = nn.Linear(4, 4, bias=False)
x = torch.randn(3, 4, requires_grad=True)
out = layer(x)
out.pow(2).sum().backward()
with torch.no_grad():
    layer.weight /= layer.weight.norm()
print(f"grad norm={x.grad.norm().item():.4f}")
