# GAN training step with the discriminator stepped before the generator's backward.
# pytorch/pytorch#39141, MorvanZhou/PyTorch-Tutorial PR #91: since PyTorch 1.5 optimizers bump the
# version of the parameters they update, so this order fails; before 1.5 it was silently wrong.
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
D = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
bce = nn.BCEWithLogitsLoss()

for step in range(3):
    real = torch.randn(8, 2) + 3
    fake = G(torch.randn(8, 4))
    d_loss = bce(D(real), torch.ones(8, 1)) + bce(D(fake), torch.zeros(8, 1))
    g_loss = bce(D(fake), torch.ones(8, 1))
    opt_d.zero_grad()
    d_loss.backward(retain_graph=True)
    opt_d.step()
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
    print(f"step {step}: d_loss={d_loss.item():.4f} g_loss={g_loss.item():.4f}")
