# Reproduction of the training step fixed by https://github.com/aladdinpersson/Machine-Learning-Collection/pull/155
# ("added retain_graph=True in Discriminator"; ML/Pytorch/GANs/1. SimpleGAN/fc_gan.py before the PR).
import torch
import torch.nn as nn
import torch.optim as optim

torch.manual_seed(0)


class Discriminator(nn.Module):
    def __init__(self, in_features):
        super().__init__()
        self.disc = nn.Sequential(nn.Linear(in_features, 16), nn.LeakyReLU(0.01), nn.Linear(16, 1), nn.Sigmoid())

    def forward(self, x):
        return self.disc(x)


class Generator(nn.Module):
    def __init__(self, z_dim, img_dim):
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(z_dim, 16), nn.LeakyReLU(0.01), nn.Linear(16, img_dim), nn.Tanh())

    def forward(self, x):
        return self.gen(x)


lr, z_dim, image_dim, batch_size = 3e-4, 8, 12, 4
disc = Discriminator(image_dim)
gen = Generator(z_dim, image_dim)
opt_disc = optim.Adam(disc.parameters(), lr=lr)
opt_gen = optim.Adam(gen.parameters(), lr=lr)
criterion = nn.BCELoss()

for batch_idx in range(2):
    real = torch.randn(batch_size, image_dim)
    ### Train Discriminator: max log(D(x)) + log(1 - D(G(z)))
    noise = torch.randn(batch_size, z_dim)
    fake = gen(noise)
    disc_real = disc(real).view(-1)
    lossD_real = criterion(disc_real, torch.ones_like(disc_real))
    disc_fake = disc(fake).view(-1)
    lossD_fake = criterion(disc_fake, torch.zeros_like(disc_fake))
    lossD = (lossD_real + lossD_fake) / 2
    disc.zero_grad()
    lossD.backward()
    opt_disc.step()

    ### Train Generator: min log(1 - D(G(z))) <-> max log(D(G(z))
    output = disc(fake).view(-1)
    lossG = criterion(output, torch.ones_like(output))
    gen.zero_grad()
    lossG.backward()
    opt_gen.step()
print(lossG.item())
