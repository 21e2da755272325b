# Reproduction of https://github.com/XuezheMax/wolf/pull/1 (the wolf normalizing-flow library's affine coupling:
# Affine.calc_params chunks the coupling net's output into mu and log_scale and squashes the scale in place,
# log_scale.mul_(0.5).tanh_(), on a view returned by chunk; the pull request clones first, the maintainer's review
# asks for the out-of-place log_scale.mul(0.5).tanh(). Library classes (Transform/Affine, Conv2dWeightNorm,
# NICEConvBlock, NICE2d with the affine transform, continuous split, no conditioning) and a maximum-likelihood step,
# shrunk to 8x8 images with 4 channels).
import math
from typing import Tuple

import torch
import torch.nn as nn

torch.manual_seed(0)


class Transform():
    def calc_params(self, params):
        return params

    @staticmethod
    def fwd(z: torch.Tensor, params) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class Affine(Transform):
    def __init__(self, dim, alpha):
        super(Affine, self).__init__()
        self.dim = dim
        self.alpha = alpha

    def calc_params(self, params):
        mu, log_scale = params.chunk(2, dim=self.dim)
        scale = log_scale.mul(0.5).tanh().mul(self.alpha).add(1.0)
        return mu, scale

    @staticmethod
    def fwd(z: torch.Tensor, params) -> Tuple[torch.Tensor, torch.Tensor]:
        mu, scale = params
        z = scale * z + mu
        logdet = scale.log().view(z.size(0), -1).sum(dim=1)
        return z, logdet


class Conv2dWeightNorm(nn.Module):
    """
    Conv2d with weight normalization
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1,
                 padding=0, dilation=1, groups=1, bias=True):
        super(Conv2dWeightNorm, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=padding, dilation=dilation, groups=groups, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.conv.weight, mean=0.0, std=0.05)
        if self.conv.bias is not None:
            nn.init.constant_(self.conv.bias, 0)
        self.conv = nn.utils.weight_norm(self.conv)

    def forward(self, input):
        return self.conv(input)


class NICEConvBlock(nn.Module):
    def __init__(self, in_channels, out_channels, hidden_channels, activation):
        super(NICEConvBlock, self).__init__()
        self.conv1 = nn.Conv2d(in_channels, hidden_channels, kernel_size=3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(hidden_channels, hidden_channels, kernel_size=1, bias=False)
        self.conv3 = Conv2dWeightNorm(hidden_channels, out_channels, kernel_size=3, padding=1, bias=True)
        self.activation = nn.ELU(inplace=True) if activation == 'elu' else nn.ReLU(inplace=True)

    def forward(self, x, h=None):
        out = self.conv1(x)
        out = self.activation(out)
        # conv2
        out = self.conv2(out)
        if h is not None:
            out = out + h
        out = self.activation(out)
        # conv3
        out = self.conv3(out)
        return out


class NICE2d(nn.Module):
    """
    NICE Flow for 2D image data
    """
    def __init__(self, in_channels, hidden_channels=None, order='up', factor=2, alpha=1.0, activation='relu'):
        super(NICE2d, self).__init__()
        self.in_channels = in_channels
        self.factor = factor
        self.up = order == 'up'
        if hidden_channels is None:
            hidden_channels = min(8 * in_channels, 512)
        out_channels = in_channels // factor
        in_channels = in_channels - out_channels
        self.z1_channels = in_channels if self.up else out_channels
        self.transform = Affine(dim=1, alpha=alpha)
        out_channels = out_channels * 2
        self.net = NICEConvBlock(in_channels, out_channels, hidden_channels, activation)

    def split(self, z):
        dim = z.size(1)
        return z.split([self.z1_channels, dim - self.z1_channels], dim=1)

    def unsplit(self, z1, z2):
        return torch.cat([z1, z2], dim=1)

    def calc_params(self, z: torch.Tensor, h=None):
        params = self.net(z, h=h)
        return params

    def forward(self, input: torch.Tensor, h=None) -> Tuple[torch.Tensor, torch.Tensor]:
        z1, z2 = self.split(input)
        z, zp = (z1, z2) if self.up else (z2, z1)

        params = self.transform.calc_params(self.calc_params(z, h=h))
        zp, logdet = self.transform.fwd(zp, params)

        z1, z2 = (z, zp) if self.up else (zp, z)
        return self.unsplit(z1, z2), logdet


flows = nn.ModuleList([NICE2d(4, hidden_channels=16, order='up'), NICE2d(4, hidden_channels=16, order='down')])
optimizer = torch.optim.Adam(flows.parameters(), lr=1e-3)

for step in range(3):
    x = torch.randn(4, 4, 8, 8)
    out, logdet_accum = x, x.new_zeros(x.size(0))
    for flow in flows:
        out, logdet = flow(out)
        logdet_accum = logdet_accum + logdet
    log_prior = -0.5 * (out.pow(2) + math.log(2 * math.pi)).view(out.size(0), -1).sum(dim=1)
    loss = -(log_prior + logdet_accum).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
