# Reproduction of https://github.com/pytorch/pytorch/pull/62293 (power iteration overwriting the u and v an earlier
# forward saved, when the discriminator runs twice before backward). The layer is the widely copied SpectralNorm
# of christiancosgrove/pytorch-spectral-normalization-gan (spectral_normalization.py) with its main.py hinge loss.
import torch
import torch.nn as nn
from torch.nn import Parameter

torch.manual_seed(0)


def l2normalize(v, eps=1e-12):
    return v / (v.norm() + eps)


class SpectralNorm(nn.Module):
    def __init__(self, module, name='weight', power_iterations=1):
        super(SpectralNorm, self).__init__()
        self.module = module
        self.name = name
        self.power_iterations = power_iterations
        self._make_params()

    def _update_u_v(self):
        u = getattr(self.module, self.name + "_u")
        v = getattr(self.module, self.name + "_v")
        w = getattr(self.module, self.name + "_bar")

        height = w.data.shape[0]
        for _ in range(self.power_iterations):
            v.data = l2normalize(torch.mv(torch.t(w.view(height,-1).data), u.data))
            u.data = l2normalize(torch.mv(w.view(height,-1).data, v.data))

        # sigma = torch.dot(u.data, torch.mv(w.view(height,-1).data, v.data))
        sigma = u.dot(w.view(height, -1).mv(v))
        setattr(self.module, self.name, w / sigma.expand_as(w))

    def _make_params(self):
        w = getattr(self.module, self.name)
        height = w.data.shape[0]
        width = w.view(height, -1).data.shape[1]
        u = Parameter(w.data.new(height).normal_(0, 1), requires_grad=False)
        v = Parameter(w.data.new(width).normal_(0, 1), requires_grad=False)
        u.data = l2normalize(u.data)
        v.data = l2normalize(v.data)
        w_bar = Parameter(w.data)
        del self.module._parameters[self.name]
        self.module.register_parameter(self.name + "_u", u)
        self.module.register_parameter(self.name + "_v", v)
        self.module.register_parameter(self.name + "_bar", w_bar)

    def forward(self, *args):
        self._update_u_v()
        return self.module.forward(*args)


Z_dim = 8
discriminator = nn.Sequential(SpectralNorm(nn.Conv2d(1, 8, 3, stride=2, padding=1)), nn.LeakyReLU(0.1),
                              nn.Flatten(), SpectralNorm(nn.Linear(8 * 4 * 4, 1)))
generator = nn.Sequential(nn.Linear(Z_dim, 64), nn.Tanh(), nn.Unflatten(1, (1, 8, 8)))
optim_disc = torch.optim.Adam(filter(lambda p: p.requires_grad, discriminator.parameters()), lr=2e-4, betas=(0.0, 0.9))
optim_gen = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.0, 0.9))

data, z = torch.randn(4, 1, 8, 8), torch.randn(4, Z_dim)
optim_disc.zero_grad()
optim_gen.zero_grad()
disc_loss = nn.ReLU()(1.0 - discriminator(data)).mean() + nn.ReLU()(1.0 + discriminator(generator(z))).mean()
disc_loss.backward()
optim_disc.step()
print(disc_loss.item())
