# Correct program after https://github.com/pytorch/pytorch/pull/57784 (spectral_norm as a parametrization: the
# power iteration updates _u and _v in place under no_grad and clones them before they are saved, so two
# discriminator passes before backward are safe).
import torch
import torch.nn as nn
from torch.nn.utils.parametrizations import spectral_norm

torch.manual_seed(0)
Z_dim = 8
discriminator = nn.Sequential(spectral_norm(nn.Conv2d(1, 8, 3, stride=2, padding=1)), nn.LeakyReLU(0.1),
                              nn.Flatten(), spectral_norm(nn.Linear(8 * 4 * 4, 1)))
generator = nn.Sequential(nn.Linear(Z_dim, 64), nn.Tanh(), nn.Unflatten(1, (1, 8, 8)))
optim_disc = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.0, 0.9))
optim_gen = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.0, 0.9))

for step in range(2):
    data, z = torch.randn(4, 1, 8, 8), torch.randn(4, Z_dim)
    # update discriminator
    optim_disc.zero_grad()
    disc_loss = nn.ReLU()(1.0 - discriminator(data)).mean() + nn.ReLU()(1.0 + discriminator(generator(z).detach())).mean()
    disc_loss.backward()
    optim_disc.step()
    # update generator
    optim_gen.zero_grad()
    gen_loss = -discriminator(generator(z)).mean()
    gen_loss.backward()
    optim_gen.step()
print(disc_loss.item(), gen_loss.item())
