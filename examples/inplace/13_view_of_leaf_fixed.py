# Fixed: initialise the parameter under torch.no_grad(). (nn.Embedding(10, 4, padding_idx=0) does this
# and also keeps the row's gradient at zero.)
import torch
from torch import nn

torch.manual_seed(0)
embedding = nn.Embedding(10, 4)
with torch.no_grad():
    embedding.weight[0] = 0
tokens = torch.tensor([[0, 3, 5], [2, 0, 7]])
loss = embedding(tokens).sum()
loss.backward()
print(f"loss={loss.item():.4f}")
