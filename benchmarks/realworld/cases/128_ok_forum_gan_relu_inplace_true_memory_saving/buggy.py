# Reproduction of https://discuss.pytorch.org/t/whats-the-difference-between-nn-relu-and-nn-relu-inplace-true/948
# (the poster implemented a GAN with nn.ReLU(inplace=True) and saw it save a little memory; the answer: inplace=True
# overwrites the input, which is valid here because no backward needs the pre-activation, and "if you don't see an
# error, your use case is valid". A correct program: a small fully connected GAN, two training iterations on CPU).
import torch
import torch.nn as nn

torch.manual_seed(0)

nz, nh, nx = 8, 32, 16

netG = nn.Sequential(
    nn.Linear(nz, nh),
    nn.BatchNorm1d(nh),
    nn.ReLU(inplace=True),
    nn.Linear(nh, nh),
    nn.ReLU(inplace=True),
    nn.Linear(nh, nx),
    nn.Tanh(),
)
netD = nn.Sequential(
    nn.Linear(nx, nh),
    nn.LeakyReLU(0.2, inplace=True),
    nn.Linear(nh, nh),
    nn.LeakyReLU(0.2, inplace=True),
    nn.Linear(nh, 1),
    nn.Sigmoid(),
)
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
real_label, fake_label = 1.0, 0.0

for i in range(2):
    real = torch.rand(16, nx) * 2 - 1
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    netD.zero_grad()
    label = torch.full((16,), real_label)
    errD_real = criterion(netD(real).view(-1), label)
    errD_real.backward()
    noise = torch.randn(16, nz)
    fake = netG(noise)
    label.fill_(fake_label)
    errD_fake = criterion(netD(fake.detach()).view(-1), label)
    errD_fake.backward()
    optimizerD.step()
    # (2) Update G network: maximize log(D(G(z)))
    netG.zero_grad()
    label.fill_(real_label)
    errG = criterion(netD(fake).view(-1), label)
    errG.backward()
    optimizerG.step()
    print(i, (errD_real + errD_fake).item(), errG.item())
