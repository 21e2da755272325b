# Reproduction of https://github.com/minyoungg/vqtorch/issues/3 (vqtorch/nn/vq.py: with an inplace_optimizer,
# VectorQuant.quantize backpropagates the codebook loss inside the forward pass and then looks the codes up again in the
# same affine-transformed codebook, whose graph that backward just freed; the training loss, which contains the
# commitment loss on z_q, then backpropagates through it a second time. _VQBaseLayer, the distance function and the
# group reshaping written out small; tabs as spaces; kmeans init and dead-code replacement dropped).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class AffineTransform(nn.Module):
    def __init__(self, feature_size, use_running_statistics=False, momentum=0.1, lr_scale=1, num_groups=1):
        super().__init__()
        self.num_groups = num_groups
        self.scale = nn.parameter.Parameter(torch.zeros(num_groups, feature_size))
        self.bias = nn.parameter.Parameter(torch.zeros(num_groups, feature_size))
        self.lr_scale = lr_scale

    def forward(self, codebook):
        scale, bias = self.get_affine_params()
        n, c = codebook.shape
        codebook = codebook.view(self.num_groups, -1, codebook.shape[-1])
        codebook = scale * codebook + bias
        return codebook.reshape(n, c)

    def get_affine_params(self):
        scale = (1. + self.lr_scale * self.scale)
        bias = self.lr_scale * self.bias
        return scale.unsqueeze(1), bias.unsqueeze(1)


class VectorQuant(nn.Module):
    def __init__(self, feature_size, num_codes, beta=0.95, affine_lr=0.0, affine_groups=1, inplace_optimizer=None):
        super().__init__()
        self.feature_size = feature_size
        self.num_codes = num_codes
        self.beta = beta
        self.codebook = nn.Embedding(self.num_codes, self.feature_size)

        if inplace_optimizer is not None:
            if beta != 1.0:
                raise ValueError('inplace_optimizer can only be used with beta=1.0')
            self.inplace_codebook_optimizer = inplace_optimizer(self.codebook.parameters())

        if affine_lr > 0:
            # defaults to using learnable affine parameters
            self.affine_transform = AffineTransform(self.feature_size, use_running_statistics=False,
                                                    lr_scale=affine_lr, num_groups=affine_groups)

    def straight_through_approximation(self, z, z_q):
        """ passed gradient from z_q to z """
        z_q = z + (z_q - z).detach()
        return z_q

    def compute_loss(self, z_e, z_q):
        """ computes loss between z and z_q """
        return ((1.0 - self.beta) * F.mse_loss(z_e, z_q.detach()) +
                (self.beta) * F.mse_loss(z_e.detach(), z_q))

    def quantize(self, codebook, z):
        z_flat = z.view(z.size(0), -1, z.size(-1))

        if hasattr(self, 'affine_transform'):
            codebook = self.affine_transform(codebook)

        with torch.no_grad():
            d = torch.cdist(z_flat, codebook.unsqueeze(0))
            q = d.argmin(-1).view(z.shape[:-1])

        z_q = F.embedding(q, codebook)

        if self.training and hasattr(self, 'inplace_codebook_optimizer'):
            # update codebook inplace
            ((z_q - z.detach()) ** 2).mean().backward()
            self.inplace_codebook_optimizer.step()
            self.inplace_codebook_optimizer.zero_grad()

            # forward pass again with the update codebook
            z_q = F.embedding(q, codebook)

            # NOTE to save compute, we assumed Q did not change.

        return z_q, d, q

    def forward(self, z):
        z_q, d, q = self.quantize(self.codebook.weight, z)

        to_return = {
            'z': z,               # each group input z_e
            'z_q': z_q,           # quantized output z_q
            'q': q,               # codes
            'loss': self.compute_loss(z, z_q).mean(),
        }

        z_q = self.straight_through_approximation(z, z_q)
        return z_q, to_return


encoder, decoder = nn.Linear(16, 8), nn.Linear(8, 16)
vq_layer = VectorQuant(feature_size=8, num_codes=32, beta=1.0, affine_lr=2.0,
                       inplace_optimizer=lambda *args, **kwargs: torch.optim.SGD(*args, **kwargs, lr=50.0))
params = list(encoder.parameters()) + list(decoder.parameters()) + list(vq_layer.affine_transform.parameters())
optimizer = torch.optim.AdamW(params, lr=1e-3)
for step in range(2):
    x = torch.randn(4, 6, 16)
    z_q, vq_out = vq_layer(encoder(x))
    x_hat = decoder(z_q)
    loss = F.mse_loss(x_hat, x) + vq_out['loss']
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item())
