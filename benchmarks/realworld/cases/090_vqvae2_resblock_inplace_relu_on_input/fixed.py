# Reproduction of https://github.com/rosinality/vq-vae-2-pytorch/issues/60 (vqvae.py ResBlock and Encoder before
# ef5f67c; the encoder shrunk to one stride and one residual block).
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)


class ResBlock(nn.Module):
    def __init__(self, in_channel, channel):
        super().__init__()

        self.conv = nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(in_channel, channel, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel, in_channel, 1),
        )

    def forward(self, input):
        out = self.conv(input)
        out += input

        return out


class Encoder(nn.Module):
    def __init__(self, in_channel, channel, n_res_block, n_res_channel):
        super().__init__()

        blocks = [
            nn.Conv2d(in_channel, channel // 2, 4, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel // 2, channel, 3, padding=1),
        ]

        for i in range(n_res_block):
            blocks.append(ResBlock(channel, n_res_channel))

        blocks.append(nn.ReLU(inplace=True))

        self.blocks = nn.Sequential(*blocks)

    def forward(self, input):
        return self.blocks(input)


enc = Encoder(3, 16, n_res_block=1, n_res_channel=8)
dec = nn.Sequential(nn.ConvTranspose2d(16, 3, 4, stride=2, padding=1))
optimizer = torch.optim.Adam(list(enc.parameters()) + list(dec.parameters()), lr=3e-4)
img = torch.randn(2, 3, 8, 8)
recon_loss = F.mse_loss(dec(enc(img)), img)
optimizer.zero_grad()
recon_loss.backward()
optimizer.step()
print(recon_loss.item())
