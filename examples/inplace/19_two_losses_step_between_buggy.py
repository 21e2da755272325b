# Multi-task training with two losses on a shared trunk, stepping after the first loss's backward and
# then backpropagating the second through the (now updated) shared weights. thuml/Anomaly-Transformer#1.
import torch
from torch import nn

torch.manual_seed(0)
trunk = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh())
head_a, head_b = nn.Linear(8, 1), nn.Linear(8, 1)
opt = torch.optim.Adam([*trunk.parameters(), *head_a.parameters(), *head_b.parameters()], lr=1e-2)
x = torch.randn(6, 4)
features = trunk(x)
loss_a = head_a(features).pow(2).mean()
loss_b = (head_b(features) - 1).pow(2).mean()
opt.zero_grad()
loss_a.backward(retain_graph=True)
opt.step()
loss_b.backward()
opt.step()
print(f"loss_a={loss_a.item():.4f} loss_b={loss_b.item():.4f}")
