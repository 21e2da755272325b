# Reproduction of https://pytroubles.com/ru/posts/id2658-gan-v-pytorch-ispravljaem-oshibku-backward-cherez-detach (a
# blog post on a GAN trained with n generator updates per discriminator step: the discriminator is fed fake_batch from
# the last generator update, whose graph g_loss.backward() already freed, so d_loss.backward() fails with "Trying to
# backward through the graph a second time"; the fix is fake_batch.detach(). MNIST replaced by random 28x28 images).
import torch
import torch.nn as nn

torch.manual_seed(0)
dev = 'cpu'
latent_dim = 16
total_epochs = 1
g_update_factor = 2
d_update_factor = 1

netG = nn.Sequential(nn.Linear(latent_dim, 64), nn.ReLU(), nn.Linear(64, 784), nn.Tanh()).to(dev)
netD = nn.Sequential(nn.Linear(784, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1), nn.Sigmoid()).to(dev)
bce_loss = nn.BCELoss()
optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
data_stream = [(torch.rand(8, 1, 28, 28) * 2 - 1, torch.zeros(8)) for _ in range(2)]

for epoch in range(total_epochs):
    for batch_id, (real_batch, _) in enumerate(data_stream):
        real_batch = real_batch.view(-1, 784).to(dev)
        bsz = real_batch.shape[0]
        # Generator updates (n times)
        for _ in range(g_update_factor):
            z = torch.randn(bsz, latent_dim).to(dev)
            fake_batch = netG(z)
            gen_scores = netD(fake_batch).view(-1)
            g_loss = bce_loss(gen_scores, torch.ones_like(gen_scores))
            g_loss.backward()
            optG.step()
            netG.zero_grad()
        # Discriminator updates (m times)
        for _ in range(d_update_factor):
            real_scores = netD(real_batch).view(-1)
            fake_scores = netD(fake_batch).view(-1)
            d_loss = bce_loss(real_scores, torch.ones_like(real_scores)) + \
                bce_loss(fake_scores, torch.zeros_like(fake_scores))
            d_loss.backward()
            optD.step()
            netD.zero_grad()
        print(epoch, batch_id, g_loss.item(), d_loss.item())
