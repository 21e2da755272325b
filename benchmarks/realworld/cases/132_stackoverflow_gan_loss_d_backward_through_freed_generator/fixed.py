# Reproduction of https://whosebug.com/question/5232549/How-does-PyTorch-s-loss-backward-work-when-retain-graph-True-is-specified
# (a Stack Overflow question: a GAN that trains the generator first, then the discriminator; loss_d is computed on the
# generator's non-detached output, so loss_d.backward() re-enters the generator graph that loss_g.backward() freed.
# The poster's update code as posted; the "computing loss_g and loss_d..." part written out with small MLPs).
import torch
import torch.nn as nn

torch.manual_seed(0)

generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
discriminator = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
optim_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
optim_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
bce = nn.BCEWithLogitsLoss()

for step in range(2):
    real = torch.randn(16, 16)
    z = torch.randn(16, 8)
    # computing loss_g and loss_d...
    fake = generator(z)
    loss_g = bce(discriminator(fake), torch.ones(16, 1))
    loss_d = bce(discriminator(real), torch.ones(16, 1)) + bce(discriminator(fake.detach()), torch.zeros(16, 1))

    optim_g.zero_grad()
    loss_g.backward()
    optim_g.step()

    optim_d.zero_grad()
    loss_d.backward()
    optim_d.step()
    print(step, loss_g.item(), loss_d.item())
