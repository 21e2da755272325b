# Reproduction of https://github.com/dmlc/dgl/pull/4219 (DGL's DimeNet example, examples/pytorch/dimenet, before that
# pull request, reported in dmlc/dgl#4204: BesselBasisLayer.reset_params fills its trainable frequencies with
# torch.arange(..., out=self.frequencies).mul_(np.pi) outside torch.no_grad(), an in-place write into a Parameter
# (a leaf that requires grad), so building DimeNet fails. The DGL graph is replaced by a minimal stand-in holding the
# edge distances in g.edata; the embedding/interaction/output blocks by one linear readout; random distances on CPU).
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)


class Envelope(nn.Module):
    """
    Envelope function that ensures a smooth cutoff
    """

    def __init__(self, exponent):
        super(Envelope, self).__init__()

        self.p = exponent + 1
        self.a = -(self.p + 1) * (self.p + 2) / 2
        self.b = self.p * (self.p + 2)
        self.c = -self.p * (self.p + 1) / 2

    def forward(self, x):
        # Envelope function divided by r
        x_p_0 = x.pow(self.p - 1)
        x_p_1 = x_p_0 * x
        x_p_2 = x_p_1 * x
        env_val = 1 / x + self.a * x_p_0 + self.b * x_p_1 + self.c * x_p_2
        return env_val


class BesselBasisLayer(nn.Module):
    def __init__(self,
                 num_radial,
                 cutoff,
                 envelope_exponent=5):
        super(BesselBasisLayer, self).__init__()

        self.cutoff = cutoff
        self.envelope = Envelope(envelope_exponent)
        self.frequencies = nn.Parameter(torch.Tensor(num_radial))
        self.reset_params()

    def reset_params(self):
        with torch.no_grad():
            torch.arange(1, self.frequencies.numel() + 1, out=self.frequencies).mul_(np.pi)
        self.frequencies.requires_grad_()

    def forward(self, g):
        d_scaled = g.edata['d'] / self.cutoff
        # Necessary for proper broadcasting behaviour
        d_scaled = torch.unsqueeze(d_scaled, -1)
        d_cutoff = self.envelope(d_scaled)
        g.edata['rbf'] = d_cutoff * torch.sin(self.frequencies * d_scaled)
        return g


class Graph:
    """Stand-in for a DGLGraph: only the edge data the basis layer reads and writes."""

    def __init__(self, d):
        self.edata = {'d': d}


class DimeNet(nn.Module):
    def __init__(self, emb_size, num_radial, cutoff=5.0, envelope_exponent=5, num_targets=12):
        super(DimeNet, self).__init__()
        self.num_radial = num_radial
        # cosine basis function expansion layer
        self.rbf_layer = BesselBasisLayer(num_radial=num_radial,
                                          cutoff=cutoff,
                                          envelope_exponent=envelope_exponent)
        self.dense = nn.Linear(num_radial, emb_size)
        self.out = nn.Linear(emb_size, num_targets)

    def forward(self, g):
        # add rbf features for each edge in one batch graph, [num_radial,]
        g = self.rbf_layer(g)
        h = torch.nn.functional.silu(self.dense(g.edata['rbf']))
        return self.out(h).sum(0, keepdim=True)


model = DimeNet(emb_size=16, num_radial=6, cutoff=5.0, envelope_exponent=5, num_targets=12)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
targets = torch.randn(1, 12)

for step in range(2):
    g = Graph(torch.rand(40) * 4.5 + 0.5)
    optimizer.zero_grad()
    loss = torch.nn.functional.l1_loss(model(g), targets)
    loss.backward()
    optimizer.step()
print(loss.item(), model.rbf_layer.frequencies.grad.abs().sum().item())
