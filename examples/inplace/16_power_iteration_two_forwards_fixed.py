# Fixed as torch.nn.utils.spectral_norm does it: the forward uses clones of u and v, so the next
# forward's in-place update does not touch what this forward saved.
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
        sigma = self.u.clone() @ self.weight @ v
        return x @ (self.weight / sigma).t()


torch.manual_seed(0)
disc = SpectralLinear(4, 3)
real, fake = torch.randn(5, 4), torch.randn(5, 4)
loss = disc(real).mean() - disc(fake).mean()
loss.backward()
print(f"loss={loss.item():.4f}")
