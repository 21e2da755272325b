# Fixed: assign into a clone, so the tensor sigmoid saved for backward stays intact.
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Linear(4, 4)
x = torch.randn(3, 4)
features = torch.sigmoid(encoder(x)).clone()
features[:, 0] = 0
loss = features.sum()
loss.backward()
print(f"loss={loss.item():.4f}")
