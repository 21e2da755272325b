# Reproduction of https://github.com/jeshraghian/snntorch/issues/250 (S-CNN tutorial; Leaky(init_hidden=True) neurons inlined).
import torch
import torch.nn as nn

torch.manual_seed(0)


class Leaky(nn.Module):
    """Minimal stand-in for snntorch.Leaky(beta, init_hidden=True): the membrane lives in the module."""

    def __init__(self, beta, init_hidden=True, output=False):
        super().__init__()
        self.beta, self.output = beta, output
        self.mem = torch.zeros(1)

    def forward(self, input_):
        self.mem = self.beta * self.mem + input_
        spk = torch.sigmoid(5 * (self.mem - 1.0))
        self.mem = self.mem - spk * 1.0
        if self.output:
            return spk, self.mem
        return spk


beta, num_steps = 0.5, 3
net = nn.Sequential(nn.Conv2d(1, 4, 3), Leaky(beta=beta, init_hidden=True), nn.Flatten(),
                    nn.Linear(4 * 6 * 6, 2), Leaky(beta=beta, init_hidden=True, output=True))


def forward_pass(net, num_steps, data):
    mem_rec = []
    spk_rec = []
    for module in net.modules():
        if isinstance(module, Leaky):
            module.mem = torch.zeros(1)
    for step in range(num_steps):
        spk_out, mem_out = net(data)
        spk_rec.append(spk_out)
        mem_rec.append(mem_out)
    return torch.stack(spk_rec), torch.stack(mem_rec)


optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
loss_fn = nn.CrossEntropyLoss()
for i in range(2):
    data, targets = torch.randn(2, 1, 8, 8), torch.tensor([0, 1])
    spk_rec, mem_rec = forward_pass(net, num_steps, data)
    loss_val = loss_fn(spk_rec.sum(0), targets)
    optimizer.zero_grad()
    loss_val.backward()
    optimizer.step()
print(loss_val.item())
