# Reproduction of https://github.com/facebookresearch/fairseq/issues/251: changing encoder_out at decode time.
import torch
from torch import nn

torch.manual_seed(0)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 4)

    def forward(self, src):
        x = self.proj(src)
        return (x, None)


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.out = nn.Linear(4, 3)

    def do_something(self, column):
        return torch.tanh(column * self.scale)

    def forward(self, encoder_out):
        for j in range(encoder_out[0].size(2)):
            encoder_out[0][:,:,j] = self.do_something(encoder_out[0][:,:,j].clone())
        return self.out(encoder_out[0])


encoder, decoder = Encoder(), Decoder()
src = torch.randn(5, 2, 6)
encoder_out = encoder(src)
loss = decoder(encoder_out).pow(2).mean()
loss.backward()
print(loss.item())
