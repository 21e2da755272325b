# Reproduction of https://github.com/lyongo/NWPU-MOC/issues/4 (models/FPN/FPN_Head.py, top-down pathway).
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)


class FPN_Head(nn.Module):
    def __init__(self, in_channels=(4, 8, 16), out_channels=4):
        super().__init__()
        self.lateral_convs = nn.ModuleList(
            [nn.Sequential(nn.Conv2d(c, out_channels, 1), nn.ReLU()) for c in in_channels])
        self.fpn_convs = nn.ModuleList([nn.Conv2d(out_channels, out_channels, 3, padding=1) for _ in in_channels])

    def forward(self, inputs):
        laterals = [lateral_conv(inputs[i]) for i, lateral_conv in enumerate(self.lateral_convs)]
        used_backbone_levels = len(laterals)
        for i in range(used_backbone_levels - 1, 0, -1):
            prev_shape = laterals[i - 1].shape[2:]
            laterals[i - 1] += F.interpolate(laterals[i], size=prev_shape, mode='nearest')
        outs = [self.fpn_convs[i](laterals[i]) for i in range(used_backbone_levels)]
        return outs


head = FPN_Head()
feats = [torch.randn(1, 4, 16, 16), torch.randn(1, 8, 8, 8), torch.randn(1, 16, 4, 4)]
outs = head(feats)
loss = sum(o.mean() for o in outs)
loss.backward()
print(loss.item())
