"""The fix for 06: fast weights computed functionally, the query loss differentiated through the inner step."""

import torch
from torch import nn
from torch.func import functional_call

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
support_x, support_y = torch.randn(10, 4), torch.randn(10, 1)
query_x, query_y = torch.randn(10, 4), torch.randn(10, 1)
inner_lr = 0.1

params = dict(model.named_parameters())
support_loss = nn.functional.mse_loss(model(support_x), support_y)
grads = torch.autograd.grad(support_loss, list(params.values()), create_graph=True)
fast = {name: p - inner_lr * g for (name, p), g in zip(params.items(), grads)}
query_loss = nn.functional.mse_loss(functional_call(model, fast, (query_x,)), query_y)
query_loss.backward()
print("meta-gradient norm:", round(model[0].weight.grad.norm().item(), 4))
