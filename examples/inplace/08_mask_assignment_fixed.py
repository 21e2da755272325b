# Fixed: mask out of place with torch.where.
import torch

torch.manual_seed(0)
scores = torch.randn(4, 6, requires_grad=True)
probs = torch.softmax(scores, dim=-1)
probs = torch.where(probs < 0.1, torch.zeros_like(probs), probs)
values = torch.randn(6, 3)
loss = (probs @ values).sum()
loss.backward()
print(f"loss={loss.item():.4f}")
