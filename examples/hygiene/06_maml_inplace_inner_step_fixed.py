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

# the same meta-gradient by finite differences of the meta-objective along one weight
def meta_objective(weights):
    support = nn.functional.mse_loss(functional_call(model, weights, (support_x,)), support_y)
    g = torch.autograd.grad(support, list(weights.values()))
    adapted = {k: v - inner_lr * d for (k, v), d in zip(weights.items(), g)}
    return nn.functional.mse_loss(functional_call(model, adapted, (query_x,)), query_y).item()


base = {k: v.detach().double().requires_grad_() for k, v in params.items()}
model.double()
eps = 1e-6
plus = {k: v.detach().clone().requires_grad_() for k, v in base.items()}
minus = {k: v.detach().clone().requires_grad_() for k, v in base.items()}
with torch.no_grad():
    plus["0.weight"][0, 0] += eps
    minus["0.weight"][0, 0] -= eps
support_x, support_y, query_x, query_y = (t.double() for t in (support_x, support_y, query_x, query_y))
numeric = (meta_objective(plus) - meta_objective(minus)) / (2 * eps)
print("meta-gradient matches finite differences:", abs(numeric - model[0].weight.grad[0, 0].item()) < 1e-4)
