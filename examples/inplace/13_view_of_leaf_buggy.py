# Zeroing the padding row of an embedding table by index assignment with grad mode on. The row is a
# view of the parameter (a leaf that requires grad).
import torch
from torch import nn

torch.manual_seed(0)
embedding = nn.Embedding(10, 4)
embedding.weight[0] = 0
tokens = torch.tensor([[0, 3, 5], [2, 0, 7]])
loss = embedding(tokens).sum()
loss.backward()
print(f"loss={loss.item():.4f}")
