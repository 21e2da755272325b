"""MAML with the inner step written into the parameters in place: the meta-gradient ignores the inner step.

The inner loop asks for a differentiable gradient (``create_graph=True``) and then applies it with
``p -= lr * g`` under ``torch.no_grad()``. tristandeleu/pytorch-meta#48, the maintainer: "PyTorch optimizers are
changing the values of the parameters in-place (which is unfortunately not compatible with gradient-based
meta-learning)"; dragen1860/MAML-Pytorch#47 (an inner update through an optimizer and load_state_dict): "any load
operation ... would remove the computational graph". The query loss reaches the parameters as plain leaves:
no error, and the meta-gradient is that of first-order training on the query set (this script prints the
comparison with the functional update).

    gradguard run examples/hygiene/06_maml_inplace_inner_step_buggy.py
"""

import torch
from torch import nn
from torch.func import functional_call

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
reference = {k: v.detach().clone() for k, v in model.named_parameters()}
support_x, support_y = torch.randn(10, 4), torch.randn(10, 1)
query_x, query_y = torch.randn(10, 4), torch.randn(10, 1)
inner_lr = 0.1

support_loss = nn.functional.mse_loss(model(support_x), support_y)
grads = torch.autograd.grad(support_loss, model.parameters(), create_graph=True)
with torch.no_grad():
    for p, g in zip(model.parameters(), grads):
        p -= inner_lr * g
query_loss = nn.functional.mse_loss(model(query_x), query_y)
query_loss.backward()

# the meta-gradient MAML means: differentiate the query loss through the inner step
params = {k: v.clone().requires_grad_() for k, v in reference.items()}
support_loss = nn.functional.mse_loss(functional_call(model, params, (support_x,)), support_y)
grads = torch.autograd.grad(support_loss, list(params.values()), create_graph=True)
fast = {k: v - inner_lr * g for (k, v), g in zip(params.items(), grads)}
nn.functional.mse_loss(functional_call(model, fast, (query_x,)), query_y).backward()
print("meta-gradient matches MAML's:", torch.allclose(model[0].weight.grad, params["0.weight"].grad))
