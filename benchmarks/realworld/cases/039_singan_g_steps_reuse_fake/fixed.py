# Reproduction of https://github.com/tamarott/SinGAN/issues/148 (SinGAN/training.py, train_single_scale, D and G loops).
import torch
import torch.nn as nn
import torch.optim as optim

torch.manual_seed(0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.LeakyReLU(0.2))
        self.tail = nn.Sequential(nn.Conv2d(8, 3, 3, padding=1), nn.Tanh())

    def forward(self, x, y):
        return self.tail(self.head(x)) + y


netG = Generator()
netD = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.LeakyReLU(0.2), nn.Conv2d(8, 1, 3, padding=1))
optimizerD = optim.Adam(netD.parameters(), lr=0.0005, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=0.0005, betas=(0.5, 0.999))
real = torch.randn(1, 3, 8, 8)
prev = torch.zeros_like(real)
Dsteps, Gsteps, alpha = 2, 3, 10

for epoch in range(1):
    noise_ = torch.randn(1, 3, 8, 8)
    ############################
    # (1) Update D network: maximize D(x) + D(G(z))
    ###########################
    for j in range(Dsteps):
        netD.zero_grad()
        output = netD(real)
        errD_real = -output.mean()
        errD_real.backward(retain_graph=True)
        noise = noise_ + prev
        fake = netG(noise.detach(), prev)
        output = netD(fake.detach())
        errD_fake = output.mean()
        errD_fake.backward(retain_graph=True)
        optimizerD.step()

    ############################
    # (2) Update G network: maximize D(G(z))
    ###########################
    for j in range(Gsteps):
        netG.zero_grad()
        fake = netG(noise.detach(), prev)
        output = netD(fake)
        errG = -output.mean()
        errG.backward(retain_graph=True)
        rec_loss = alpha * nn.MSELoss()(netG(prev, prev), real)
        rec_loss.backward(retain_graph=True)
        optimizerG.step()
print(errG.item())
