# Activation offloading with the user's own saved-tensor hooks, in a short training loop.
import torch
from torch.autograd.graph import save_on_cpu, saved_tensors_hooks

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
packs = []


def pack(t):
    packs.append(1)
    return t.to(torch.bfloat16), t.dtype


def unpack(p):
    return p[0].to(p[1])


for step in range(3):
    opt.zero_grad()
    with saved_tensors_hooks(pack, unpack):
        loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    opt.step()
with save_on_cpu():
    model(torch.randn(4, 8)).sum().backward()
print("packs", len(packs))
print("weights", [round(p.double().sum().item(), 12) for p in model.parameters()])
