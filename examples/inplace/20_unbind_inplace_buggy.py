# Unpacking a stacked tensor with unbind() and doubling one piece in place.
import torch

torch.manual_seed(0)
pair = torch.randn(2, 3, requires_grad=True) * 1.0
a, b = pair.unbind(0)
a.mul_(2)
loss = (a * b).sum()
loss.backward()
print(f"loss={loss.item():.4f}")
