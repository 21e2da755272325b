# Reproduction of https://github.com/PingoLH/FCHarDNet/issues/61 (test.py, fusing BN into a conv before testing).
import torch
from torch import nn

torch.manual_seed(0)
conv = nn.Conv2d(3, 4, 3, bias=False)
bn = nn.BatchNorm2d(4)
bn.eval()
cconv = nn.Conv2d(3, 4, 3, bias=True)

W = conv.weight * (bn.weight / torch.sqrt(bn.running_var + bn.eps)).view(-1, 1, 1, 1)
b = bn.bias - bn.running_mean * bn.weight / torch.sqrt(bn.running_var + bn.eps)
with torch.no_grad():
    cconv.weight[:,:,:,:] = W[:,:,:,:]
    cconv.bias[:] = b[:]
x = torch.randn(1, 3, 6, 6)
print((cconv(x) - bn(conv(x))).abs().max())
