# Reproduction of https://github.com/pytorch/pytorch/issues/26596 (an nn.Embedding with max_norm=True is used twice:
# its whole weight matrix is scored against W (a = embedding.weight @ W.t()), then it is looked up
# (embedding(idx)); the lookup renormalizes the looked-up rows of embedding.weight in place (embedding_renorm_
# under no_grad), after the matmul saved embedding.weight for W's gradient, and loss.backward() fails with "one of the
# variables needed for gradient computation has been modified by an inplace operation". The issue's script as
# posted; the maintainers' answer (pull request #45595, the note in the nn.Embedding docs) is to clone the weight
# before using it in a differentiable op).
import torch
import torch.nn as nn

torch.manual_seed(0)

n, d, m = 3, 5, 7
batch_size = 11

embedding = nn.Embedding(n, d, max_norm=True)
W = torch.randn((m, d), requires_grad=True)
optimizer = torch.optim.Adam(list(embedding.parameters()) + [W], lr=1e-3)

optimizer.zero_grad()
idx = torch.tensor([1, 2])

a = embedding.weight.clone() @ W.t()  # Line a: weight must be cloned for this to be differentiable
b = embedding(idx) @ W.t()    # Line b

out = (a.unsqueeze(0) + b.unsqueeze(1))
loss = out.sigmoid().prod()
loss.backward()
optimizer.step()
print('loss', loss.item())
