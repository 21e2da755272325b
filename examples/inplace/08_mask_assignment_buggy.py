# Pruning small attention probabilities by boolean-mask assignment. softmax saves its output for backward.
# fiveai/making-better-mistakes#4.
import torch

torch.manual_seed(0)
scores = torch.randn(4, 6, requires_grad=True)
probs = torch.softmax(scores, dim=-1)
probs[probs < 0.1] = 0.0
values = torch.randn(6, 3)
loss = (probs @ values).sum()
loss.backward()
print(f"loss={loss.item():.4f}")
