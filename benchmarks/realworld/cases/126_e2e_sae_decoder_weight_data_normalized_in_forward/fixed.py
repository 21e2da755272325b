# Reproduction of https://github.com/ApolloResearch/e2e_sae/pull/46 (e2e_sae/models/sparsifiers.py before that pull
# request: SAE.forward applies the unit-norm constraint by overwriting self.decoder.weight.data with its normalised
# value, so autograd never sees the normalisation and Adam's state drifts from the real gradients; the pull request
# normalises into a new tensor instead. Training of one SAE on random activations, shrunk).
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)


class SAE(nn.Module):
    """
    Sparse AutoEncoder
    """

    def __init__(self, input_size: int, n_dict_components: int, init_decoder_orthogonal: bool = True):
        super().__init__()
        # self.encoder[0].weight has shape: (n_dict_components, input_size)
        # self.decoder.weight has shape:    (input_size, n_dict_components)

        self.encoder = nn.Sequential(nn.Linear(input_size, n_dict_components, bias=True), nn.ReLU())
        self.decoder = nn.Linear(n_dict_components, input_size, bias=True)
        self.n_dict_components = n_dict_components
        self.input_size = input_size

        if init_decoder_orthogonal:
            # Initialize so that there are n_dict_components orthonormal vectors
            self.decoder.weight.data = nn.init.orthogonal_(self.decoder.weight.data.T).T

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pass input through the encoder and normalized decoder."""
        c = self.encoder(x)
        x_hat = F.linear(c, self.dict_elements, bias=self.decoder.bias)
        return x_hat, c

    @property
    def dict_elements(self):
        """Dictionary elements are simply the normalized decoder weights."""
        return F.normalize(self.decoder.weight, dim=0)


sae = SAE(input_size=8, n_dict_components=32)
optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
acts = torch.randn(64, 8)
sparsity_coeff = 1e-2

for step in range(3):
    optimizer.zero_grad()
    x_hat, c = sae(acts)
    loss = F.mse_loss(x_hat, acts) + sparsity_coeff * c.abs().sum(dim=-1).mean()
    loss.backward()
    optimizer.step()
print(loss.item())
