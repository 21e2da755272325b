# Correct program: the WGAN loop discussed in https://github.com/eriklindernoren/PyTorch-GAN/issues/151 (implementations/wgan/wgan.py).
import torch
import torch.nn as nn

torch.manual_seed(0)
latent_dim, clip_value, n_critic = 4, 0.01, 2
generator = nn.Sequential(nn.Linear(latent_dim, 16), nn.LeakyReLU(0.2, inplace=True), nn.Linear(16, 8), nn.Tanh())
discriminator = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2, inplace=True), nn.Linear(16, 1))
optimizer_G = torch.optim.RMSprop(generator.parameters(), lr=0.00005)
optimizer_D = torch.optim.RMSprop(discriminator.parameters(), lr=0.00005)
for i in range(4):
    real_imgs = torch.randn(5, 8)
    optimizer_D.zero_grad()
    z = torch.randn(5, latent_dim)
    fake_imgs = generator(z).detach()
    loss_D = -torch.mean(discriminator(real_imgs)) + torch.mean(discriminator(fake_imgs))
    loss_D.backward()
    optimizer_D.step()
    for p in discriminator.parameters():
        p.data.clamp_(-clip_value, clip_value)
    if i % n_critic == 0:
        optimizer_G.zero_grad()
        gen_imgs = generator(z)
        loss_G = -torch.mean(discriminator(gen_imgs))
        loss_G.backward()
        optimizer_G.step()
print(loss_D.item())
