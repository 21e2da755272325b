# Reproduction of https://github.com/open-mmlab/mmdetection/pull/9450 (mmdet/models/necks/pafpn.py before the pull
# request: with act_cfg=dict(type='ReLU') every ConvModule ends in a ReLU, which saves its output, and PAFPN.forward
# adds into the lateral and fpn outputs with +=; mmcv's ConvModule and mmdet's FPN.__init__ written out small,
# init_cfg and the extra levels dropped).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class ConvModule(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, conv_cfg=None, norm_cfg=None,
                 act_cfg=dict(type='ReLU'), inplace=True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.with_activation = act_cfg is not None
        if self.with_activation:
            self.activate = nn.ReLU(inplace=inplace)

    def forward(self, x):
        x = self.conv(x)
        if self.with_activation:
            x = self.activate(x)
        return x


class FPN(nn.Module):
    def __init__(self, in_channels, out_channels, num_outs, start_level=0, end_level=-1, conv_cfg=None,
                 norm_cfg=None, act_cfg=None):
        super(FPN, self).__init__()
        self.in_channels = in_channels
        self.num_outs = num_outs
        self.backbone_end_level = len(in_channels) if end_level == -1 else end_level
        self.start_level = start_level
        self.lateral_convs = nn.ModuleList()
        self.fpn_convs = nn.ModuleList()
        for i in range(self.start_level, self.backbone_end_level):
            l_conv = ConvModule(in_channels[i], out_channels, 1, conv_cfg=conv_cfg, norm_cfg=norm_cfg,
                                act_cfg=act_cfg, inplace=False)
            fpn_conv = ConvModule(out_channels, out_channels, 3, padding=1, conv_cfg=conv_cfg, norm_cfg=norm_cfg,
                                  act_cfg=act_cfg, inplace=False)
            self.lateral_convs.append(l_conv)
            self.fpn_convs.append(fpn_conv)


class PAFPN(FPN):
    def __init__(self, in_channels, out_channels, num_outs, start_level=0, end_level=-1, conv_cfg=None,
                 norm_cfg=None, act_cfg=None):
        super(PAFPN, self).__init__(in_channels, out_channels, num_outs, start_level, end_level, conv_cfg,
                                    norm_cfg, act_cfg)
        # add extra bottom up pathway
        self.downsample_convs = nn.ModuleList()
        self.pafpn_convs = nn.ModuleList()
        for i in range(self.start_level + 1, self.backbone_end_level):
            d_conv = ConvModule(out_channels, out_channels, 3, stride=2, padding=1, conv_cfg=conv_cfg,
                                norm_cfg=norm_cfg, act_cfg=act_cfg, inplace=False)
            pafpn_conv = ConvModule(out_channels, out_channels, 3, padding=1, conv_cfg=conv_cfg, norm_cfg=norm_cfg,
                                    act_cfg=act_cfg, inplace=False)
            self.downsample_convs.append(d_conv)
            self.pafpn_convs.append(pafpn_conv)

    def forward(self, inputs):
        """Forward function."""
        assert len(inputs) == len(self.in_channels)

        # build laterals
        laterals = [
            lateral_conv(inputs[i + self.start_level])
            for i, lateral_conv in enumerate(self.lateral_convs)
        ]

        # build top-down path
        used_backbone_levels = len(laterals)
        for i in range(used_backbone_levels - 1, 0, -1):
            prev_shape = laterals[i - 1].shape[2:]
            laterals[i - 1] = laterals[i - 1] + F.interpolate(
                laterals[i], size=prev_shape, mode='nearest')

        # build outputs
        # part 1: from original levels
        inter_outs = [
            self.fpn_convs[i](laterals[i]) for i in range(used_backbone_levels)
        ]

        # part 2: add bottom-up path
        for i in range(0, used_backbone_levels - 1):
            inter_outs[i + 1] = inter_outs[i + 1] + \
                                self.downsample_convs[i](inter_outs[i])

        outs = []
        outs.append(inter_outs[0])
        outs.extend([
            self.pafpn_convs[i - 1](inter_outs[i])
            for i in range(1, used_backbone_levels)
        ])
        return tuple(outs)


neck = PAFPN(in_channels=[4, 8, 16], out_channels=8, num_outs=3, act_cfg=dict(type='ReLU'))
feats = [torch.randn(1, 4, 16, 16), torch.randn(1, 8, 8, 8), torch.randn(1, 16, 4, 4)]
outs = neck(feats)
loss = sum(out.mean() for out in outs)
loss.backward()
print(loss.item())
