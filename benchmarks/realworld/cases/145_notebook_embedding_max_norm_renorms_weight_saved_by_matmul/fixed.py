# Reproduction of https://github.com/zhuyuedlut/AIGC/blob/b3f710b421f4ede90ae9855a1683844f266e9f5a/notebook/pytorch/basic/inplace_operation.ipynb
# (a Chinese PyTorch tutorial notebook on in-place operations, after the note in the nn.Embedding docs: a =
# embedding.weight @ W.t() saves embedding.weight for W's gradient, then embedding(idx) with max_norm=1 renormalises
# the looked-up rows of embedding.weight in place, so loss.backward() fails with "[torch.FloatTensor [3, 5]] is at
# version 2; expected version 1". The notebook's cell as written; the fix, in the cell before it, is
# embedding.weight.clone()).
import torch
from torch import nn

torch.manual_seed(0)

n, d, m = 3, 5, 7
embedding = nn.Embedding(n, d, max_norm=1)
W = torch.randn((m, d), requires_grad=True)
idx = torch.tensor([1, 2])
a = embedding.weight.clone() @ W.t() # weight must be cloned for this to be differentiable
b = embedding(idx) @ W.t()
out = (a.unsqueeze(0) + b.unsqueeze(1))
loss = out.sigmoid().prod()
loss.backward()
print(loss.item(), W.grad.norm().item())
