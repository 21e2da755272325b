# Reproduction of https://github.com/meetps/pytorch-semseg/issues/121 (ptsemseg/models/pspnet.py and utils.py:
# conv2DBatchNormRelu, a one-level pyramid pooling, cbr_final, then self.dropout; shrunk).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class conv2DBatchNormRelu(nn.Module):
    def __init__(self, in_channels, n_filters, k_size, stride, padding, bias=True):
        super(conv2DBatchNormRelu, self).__init__()
        self.cbr_unit = nn.Sequential(nn.Conv2d(in_channels, n_filters, k_size, stride, padding, bias=bias),
                                      nn.BatchNorm2d(n_filters), nn.ReLU(inplace=True))

    def forward(self, inputs):
        return self.cbr_unit(inputs)


class pspnet(nn.Module):
    def __init__(self, n_classes=5):
        super(pspnet, self).__init__()
        self.convbnrelu1 = conv2DBatchNormRelu(3, 16, 3, 2, 1, bias=False)
        self.pool_conv = conv2DBatchNormRelu(16, 4, 1, 1, 0, bias=False)
        self.cbr_final = conv2DBatchNormRelu(20, 16, 3, 1, 1, bias=False)
        self.dropout = nn.Dropout2d(p=0.1, inplace=False)
        self.classification = nn.Conv2d(16, n_classes, 1, 1, 0)

    def forward(self, x):
        inp_shape = x.shape[2:]
        x = self.convbnrelu1(x)
        pooled = F.interpolate(self.pool_conv(F.adaptive_avg_pool2d(x, 1)), size=x.shape[2:], mode='bilinear',
                               align_corners=True)
        x = torch.cat([x, pooled], dim=1)
        x = self.cbr_final(x)
        x = self.dropout(x)
        x = self.classification(x)
        return F.interpolate(x, size=inp_shape, mode='bilinear', align_corners=True)


model = pspnet()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
images, labels = torch.randn(2, 3, 16, 16), torch.randint(0, 5, (2, 16, 16))
loss = F.cross_entropy(model(images), labels)
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
