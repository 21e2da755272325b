# Reproduction of https://github.com/open-mmlab/mmflow/pull/252 (mmflow's BasicBlock in models/utils/res_layer.py
# applied the ReLU and then added the shortcut in place, `out += identity`, into that ReLU's output, which ReluBackward
# saved; training RAFT then failed in backward with "one of the variables needed for gradient computation has been
# modified by an inplace operation" (issues #123 and #248); the pull request writes `out = out + identity`. The
# library's BasicBlock, ResLayer and RAFTEncoder (feature encoder with IN, context encoder with BN) and
# RAFT.extract_feat before the fix, shrunk (channels 8-16, 32x32 images); mmcv's build_* helpers written as small local
# functions; the RAFT decoder (correlation lookup + GRU iterations + sequence loss) replaced by an all-pairs
# correlation, a 1x1 flow head and an L1 loss).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


# mmcv.cnn builders (stand-ins)
def build_conv_layer(cfg, *args, **kwargs):
    return nn.Conv2d(*args, **kwargs)


def build_norm_layer(cfg, num_features, postfix=''):
    if cfg['type'] == 'IN':
        return 'in' + str(postfix), nn.InstanceNorm2d(num_features)
    return 'bn' + str(postfix), nn.BatchNorm2d(num_features)


def build_activation_layer(cfg):
    return nn.ReLU()


# mmflow/models/utils/res_layer.py

class BasicBlock(nn.Module):
    """Basic block for ResNet."""

    expansion = 1

    def __init__(self,
                 inplanes,
                 planes,
                 stride=1,
                 dilation=1,
                 downsample=None,
                 style='pytorch',
                 with_cp=False,
                 conv_cfg=None,
                 norm_cfg=dict(type='BN'),
                 act_cfg=dict(type='ReLU'),
                 dcn=None,
                 plugins=None):
        super(BasicBlock, self).__init__()
        self.norm1_name, norm1 = build_norm_layer(norm_cfg, planes, postfix=1)
        self.norm2_name, norm2 = build_norm_layer(norm_cfg, planes, postfix=2)

        self.conv1 = build_conv_layer(
            conv_cfg,
            inplanes,
            planes,
            3,
            stride=stride,
            padding=1,
            dilation=dilation,
            bias=True)
        self.add_module(self.norm1_name, norm1)
        self.conv2 = build_conv_layer(
            conv_cfg, planes, planes, 3, padding=1, bias=True)
        self.add_module(self.norm2_name, norm2)

        self.relu = build_activation_layer(act_cfg)
        self.downsample = downsample
        self.stride = stride
        self.dilation = dilation
        self.with_cp = with_cp

    @property
    def norm1(self):
        return getattr(self, self.norm1_name)

    @property
    def norm2(self):
        return getattr(self, self.norm2_name)

    def forward(self, x):
        """Forward function."""

        def _inner_forward(x):
            identity = x

            out = self.conv1(x)
            out = self.norm1(out)
            out = self.relu(out)

            out = self.conv2(out)
            out = self.norm2(out)
            out = self.relu(out)

            if self.downsample is not None:
                identity = self.downsample(x)

            out = out + identity

            return out

        out = _inner_forward(x)

        out = self.relu(out)

        return out


class ResLayer(nn.Sequential):
    def __init__(self,
                 block,
                 inplanes,
                 planes,
                 num_blocks,
                 stride=1,
                 dilation=1,
                 conv_cfg=None,
                 norm_cfg=dict(type='BN'),
                 **kwargs):
        self.block = block

        downsample = None
        if stride != 1 or inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                build_conv_layer(
                    conv_cfg,
                    inplanes,
                    planes * block.expansion,
                    kernel_size=1,
                    stride=stride,
                    bias=True),
                build_norm_layer(norm_cfg, planes * block.expansion)[1])

        layers = []
        layers.append(
            block(
                inplanes=inplanes,
                planes=planes,
                stride=stride,
                dilation=dilation,
                downsample=downsample,
                conv_cfg=conv_cfg,
                norm_cfg=norm_cfg,
                **kwargs))
        inplanes = planes * block.expansion
        for i in range(1, num_blocks):
            layers.append(
                block(
                    inplanes=inplanes,
                    planes=planes,
                    stride=1,
                    dilation=dilation,
                    conv_cfg=conv_cfg,
                    norm_cfg=norm_cfg,
                    **kwargs))
        super(ResLayer, self).__init__(*layers)


# mmflow/models/encoders/raft_encoder.py

class RAFTEncoder(nn.Module):
    def __init__(self, in_channels, out_channels, stem_channels=8, base_channels=(8, 12, 16),
                 strides=(1, 2, 2), stage_blocks=(2, 2, 2), conv_cfg=None,
                 norm_cfg=dict(type='BN', requires_grad=True)):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.base_channels = base_channels
        self.conv_cfg = conv_cfg
        self.norm_cfg = norm_cfg
        self.inplanes = stem_channels

        self.conv1 = build_conv_layer(
            self.conv_cfg, in_channels, stem_channels, kernel_size=7, stride=2, padding=3, bias=True)
        self.norm1_name, norm1 = build_norm_layer(self.norm_cfg, stem_channels, postfix=1)
        self.add_module(self.norm1_name, norm1)
        self.relu = nn.ReLU(inplace=True)

        self.res_layers = []
        for i, num_blocks in enumerate(stage_blocks):
            planes = self.base_channels[i]
            res_layer = ResLayer(
                block=BasicBlock,
                inplanes=self.inplanes,
                planes=planes,
                num_blocks=num_blocks,
                stride=strides[i],
                conv_cfg=conv_cfg,
                norm_cfg=norm_cfg)
            self.inplanes = planes
            layer_name = f'res_layer{i+1}'
            self.add_module(layer_name, res_layer)
            self.res_layers.append(layer_name)

        self.conv2 = build_conv_layer(self.conv_cfg, self.base_channels[-1], out_channels, kernel_size=1)

    @property
    def norm1(self):
        return getattr(self, self.norm1_name)

    def forward(self, x):
        x = self.conv1(x)
        x = self.norm1(x)
        x = self.relu(x)
        for layer_name in self.res_layers:
            res_layer = getattr(self, layer_name)
            x = res_layer(x)
        out = self.conv2(x)
        return out


# mmflow/models/flow_estimators/raft.py (decoder replaced by a small stand-in)

class RAFT(nn.Module):
    def __init__(self, h_channels=8, cxt_channels=8):
        super().__init__()
        self.encoder = RAFTEncoder(in_channels=3, out_channels=16, norm_cfg=dict(type='IN'))
        self.context = RAFTEncoder(in_channels=3, out_channels=h_channels + cxt_channels,
                                   norm_cfg=dict(type='SyncBN'))
        self.h_channels = h_channels
        self.cxt_channels = cxt_channels
        self.flow_head = nn.Conv2d(16 + h_channels + cxt_channels, 2, 1)

    def extract_feat(self, imgs):
        in_channels = self.encoder.in_channels
        img1 = imgs[:, :in_channels, ...]
        img2 = imgs[:, in_channels:, ...]

        feat1 = self.encoder(img1)
        feat2 = self.encoder(img2)
        cxt_feat = self.context(img1)

        h_feat, cxt_feat = torch.split(
            cxt_feat, [self.h_channels, self.cxt_channels], dim=1)
        h_feat = torch.tanh(h_feat)
        cxt_feat = torch.relu(cxt_feat)

        return feat1, feat2, h_feat, cxt_feat

    def forward_train(self, imgs, flow_gt):
        feat1, feat2, h_feat, cxt_feat = self.extract_feat(imgs)
        B, C, H, W = feat1.shape
        corr = torch.einsum('bchw,bcuv->bhwuv', feat1, feat2).reshape(B, H, W, H * W) / C ** 0.5
        corr = corr.permute(0, 3, 1, 2)[:, :16]
        flow = self.flow_head(torch.cat([corr, h_feat, cxt_feat], dim=1))
        flow_up = 8 * F.interpolate(flow, scale_factor=8, mode='bilinear', align_corners=True)
        return dict(loss_flow=(flow_up - flow_gt).abs().mean())


model = RAFT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for it in range(2):
    imgs = torch.randn(2, 6, 32, 32)
    flow_gt = torch.randn(2, 2, 32, 32)
    losses = model.forward_train(imgs, flow_gt)
    optimizer.zero_grad()
    losses['loss_flow'].backward()
    optimizer.step()
    print(it, losses['loss_flow'].item())
