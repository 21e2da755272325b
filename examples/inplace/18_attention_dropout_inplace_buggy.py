# In-place dropout on attention probabilities: softmax's backward needs its output.
# qianyu-dlut/MVANet#2, NVlabs/FUNIT#23 (in-place modules whose input is needed later).
import torch
from torch import nn

torch.manual_seed(0)
dropout = nn.Dropout(p=0.1, inplace=True)
q, k, v = torch.randn(3, 2, 5, 4, requires_grad=True).unbind(0)
attention = torch.softmax(q @ k.transpose(1, 2) / 2.0, dim=-1)
attention = dropout(attention)
loss = (attention @ v).sum()
loss.backward()
print(f"loss={loss.item():.4f}")
