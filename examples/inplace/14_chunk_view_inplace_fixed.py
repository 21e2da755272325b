# Fixed: scale out of place.
import torch
from torch import nn

torch.manual_seed(0)
qkv_proj = nn.Linear(8, 24)
x = torch.randn(2, 5, 8)
q, k, v = qkv_proj(x).chunk(3, dim=-1)
q = q * 8 ** -0.5
attention = torch.softmax(q @ k.transpose(1, 2), dim=-1)
loss = (attention @ v).sum()
loss.backward()
print(f"loss={loss.item():.4f}")
