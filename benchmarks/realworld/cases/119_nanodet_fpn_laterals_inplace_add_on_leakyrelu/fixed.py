# Reproduction of https://github.com/RangiLyu/nanodet/pull/493 (nanodet/model/fpn/fpn.py before the pull request: with
# fpn name FPN and activation LeakyReLU, every lateral ConvModule ends in nn.LeakyReLU(negative_slope=0.1, inplace=True)
# from act_layers, whose output LeakyReluBackward1 saves, and the top-down path adds into it with +=; ConvModule and
# act_layers written out small, the ShuffleNetV2 backbone replaced by three random feature maps, the NanoDet head by a
# 1x1 conv and a mean).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


def act_layers(name):
    if name == "LeakyReLU":
        return nn.LeakyReLU(negative_slope=0.1, inplace=True)
    return nn.ReLU(inplace=True)


class ConvModule(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, conv_cfg=None, norm_cfg=None, activation="ReLU",
                 inplace=True):
        super(ConvModule, self).__init__()
        self.activation = activation
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.BatchNorm2d(out_channels) if norm_cfg is not None else None
        if self.activation:
            self.act = act_layers(self.activation)

    def forward(self, x):
        x = self.conv(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.activation:
            x = self.act(x)
        return x


class FPN(nn.Module):
    def __init__(self, in_channels, out_channels, num_outs, start_level=0, end_level=-1, conv_cfg=None,
                 norm_cfg=None, activation=None):
        super(FPN, self).__init__()
        assert isinstance(in_channels, list)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_ins = len(in_channels)
        self.num_outs = num_outs
        self.backbone_end_level = self.num_ins
        self.start_level = start_level
        self.lateral_convs = nn.ModuleList()

        for i in range(self.start_level, self.backbone_end_level):
            l_conv = ConvModule(
                in_channels[i],
                out_channels,
                1,
                conv_cfg=conv_cfg,
                norm_cfg=norm_cfg,
                activation=activation,
                inplace=False,
            )

            self.lateral_convs.append(l_conv)

    def forward(self, inputs):
        assert len(inputs) == len(self.in_channels)

        # build laterals
        laterals_ = [
            lateral_conv(inputs[i + self.start_level])
            for i, lateral_conv in enumerate(self.lateral_convs)
        ]

        # build top-down path
        used_backbone_levels = len(laterals_)
        laterals = [laterals_[-1]]
        for i in range(used_backbone_levels - 1, 0, -1):
            laterals.insert(
                0,
                laterals_[i - 1]
                + F.interpolate(laterals_[i], scale_factor=2, mode="bilinear"),
            )

        # build outputs
        outs = [
            # self.fpn_convs[i](laterals[i]) for i in range(used_backbone_levels)
            laterals[i]
            for i in range(used_backbone_levels)
        ]
        return tuple(outs)


fpn = FPN(in_channels=[8, 16, 32], out_channels=8, num_outs=3, norm_cfg=dict(type="BN"), activation="LeakyReLU")
head = nn.Conv2d(8, 5, 1)
optimizer = torch.optim.SGD(list(fpn.parameters()) + list(head.parameters()), lr=0.01)
feats = (torch.randn(2, 8, 16, 16), torch.randn(2, 16, 8, 8), torch.randn(2, 32, 4, 4))
outs = fpn(feats)
loss = sum(head(out).pow(2).mean() for out in outs)
loss.backward()
optimizer.step()
print(loss.item())
