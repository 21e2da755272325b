# A hand-rolled spectral norm whose power-iteration vector `u` is updated in place in every forward.
# A discriminator run on real and fake batches before one backward: the second forward overwrites the
# `u` the first forward saved. pytorch/pytorch#55368, #66363.
import torch
from torch import nn


class SpectralLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.3)
        self.register_buffer("u", nn.functional.normalize(torch.randn(n_out), dim=0))

    def forward(self, x):
        with torch.no_grad():
            v = nn.functional.normalize(self.weight.t() @ self.u, dim=0)
            self.u.copy_(nn.functional.normalize(self.weight @ v, dim=0))
        sigma = self.u @ self.weight @ v
        return x @ (self.weight / sigma).t()


torch.manual_seed(0)
disc = SpectralLinear(4, 3)
real, fake = torch.randn(5, 4), torch.randn(5, 4)
loss = disc(real).mean() - disc(fake).mean()
loss.backward()
print(f"loss={loss.item():.4f}")
