# Reproduction of https://github.com/pytorch/pytorch/issues/68327 (a PyTorch issue: a discriminator wrapped in
# torch.nn.utils.parametrizations.spectral_norm is called on real and on generated data and the summed loss is
# backpropagated once; on PyTorch 1.10 the second call's in-place power iteration on the buffers _u/_v broke the
# first call's backward with "modified by an inplace operation". Current PyTorch clones _u and _v after the no_grad
# in-place power iteration, so the script, kept as written (seeded), is a correct program: both forwards and
# the one backward run, with the right gradients).
import torch
from torch import nn
from torch.nn.utils import spectral_norm as sn1
from torch.nn.utils.parametrizations import spectral_norm as sn2

torch.manual_seed(0)


def run_with_spectral(spectral):
    discriminator = spectral(nn.Linear(10, 1))
    optim = torch.optim.Adam(discriminator.parameters())
    loss = nn.L1Loss()

    X = torch.ones(4, 10)
    real = torch.ones(4, 1)
    fake = torch.zeros(4, 1)

    optim.zero_grad()
    generated = torch.rand(4, 10)

    loss_real = loss(discriminator(X), real)
    loss_fake = loss(discriminator(generated), fake)

    l = loss_real + loss_fake

    l.backward()
    optim.step()
    print(spectral.__module__, l.item())


if __name__ == "__main__":
    run_with_spectral(sn1)
    run_with_spectral(sn2)
