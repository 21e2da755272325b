# Reproduction of https://github.com/phanideepgampa/stacked-capsule-networks/issues/15 (model.py: pose angles of the part capsules).
import math
import torch
from torch import nn

torch.manual_seed(0)


class PartCapsuleEncoder(nn.Module):
    def __init__(self, n_caps=4, feat=12):
        super().__init__()
        self.n_caps = n_caps
        self.features = nn.Linear(feat, n_caps * 6)

    def forward(self, x):
        pose = self.features(x).view(x.size(0), self.n_caps, 6)
        trans_xy, scale_xy, theta, shear = pose.split([2, 2, 1, 1], dim=-1)
        scale_xy = torch.sigmoid(scale_xy) + 1e-2
        theta = torch.sigmoid(theta)
        theta = theta * 2. * math.pi
        cos, sin = torch.cos(theta), torch.sin(theta)
        return torch.cat([scale_xy * cos, -scale_xy * sin, trans_xy, shear], dim=-1)


encoder = PartCapsuleEncoder()
poses = encoder(torch.randn(3, 12))
loss = poses.pow(2).mean()
loss.backward()
print(loss.item())
