# A slice taken under torch.no_grad() (to "just look" at the first features), later clamped in place
# with grad mode back on.
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Linear(4, 6)
hidden = encoder(torch.randn(3, 4))
with torch.no_grad():
    first = hidden[:, :2]
first.clamp_(min=0)
loss = hidden.sum()
loss.backward()
print(f"loss={loss.item():.4f}")
