# Reproduction of https://github.com/yzhao062/pyod/issues/606 (pyod/models/deep_svdd.py: `# loss.backward()` commented out).
import torch
import torch.nn as nn

torch.manual_seed(0)


class InnerDeepSVDD(nn.Module):
    def __init__(self, n_features, hidden_neurons=(8, 4)):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(n_features, hidden_neurons[0], bias=False), nn.ReLU(),
                                   nn.Linear(hidden_neurons[0], hidden_neurons[1], bias=False))
        self.c = None

    def _init_c(self, X_norm, eps=0.1):
        intermediate_output = {}
        hook_handle = self.model[-1].register_forward_hook(
            lambda module, input, output: intermediate_output.update({'inter_output': output}))
        output = self.model(X_norm)
        out = intermediate_output['inter_output']
        hook_handle.remove()
        self.c = torch.mean(out, dim=0).detach()
        self.c[(torch.abs(self.c) < eps) & (self.c < 0)] = -eps
        self.c[(torch.abs(self.c) < eps) & (self.c > 0)] = eps

    def forward(self, x):
        return self.model(x)


X_norm = torch.randn(20, 6)
model = InnerDeepSVDD(6)
model._init_c(X_norm)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    for batch_x in X_norm.split(10):
        outputs = model(batch_x)
        dist = torch.sum((outputs - model.c) ** 2, dim=-1)
        loss = torch.mean(dist)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
print(loss.item())
