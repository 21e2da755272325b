# Correct program: a discriminator wrapped in torch.nn.utils.spectral_norm
# (https://github.com/pytorch/pytorch/blob/main/torch/nn/utils/spectral_norm.py updates u and v in place under no_grad
# in each training forward; the weight it computes is a fresh tensor, so backward is unaffected).
import torch
import torch.nn as nn
from torch.nn.utils import spectral_norm

torch.manual_seed(0)
D = nn.Sequential(spectral_norm(nn.Linear(8, 16)), nn.LeakyReLU(0.1, inplace=True), spectral_norm(nn.Linear(16, 1)))
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(inplace=True), nn.Linear(16, 8))
opt_D = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.0, 0.9))
opt_G = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.0, 0.9))
for step in range(2):
    real, z = torch.randn(6, 8), torch.randn(6, 4)
    fake = G(z)
    loss_D = torch.relu(1 - D(real)).mean() + torch.relu(1 + D(fake.detach())).mean()
    opt_D.zero_grad()
    loss_D.backward()
    opt_D.step()
    loss_G = -D(fake).mean()
    opt_G.zero_grad()
    loss_G.backward()
    opt_G.step()
print(loss_G.item())
