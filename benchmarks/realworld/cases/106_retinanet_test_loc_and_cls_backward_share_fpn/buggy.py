# Reproduction of https://github.com/kuangliu/pytorch-retinanet/issues/38 (retinanet.py test(): loc_preds and cls_preds
# come out of the same FPN forward, and the second .backward() runs through the FPN graph the first one freed; FPN50
# shrunk to a two-level FPN over a two-conv backbone, 256 channels to 8, Variable() kept as in the file).
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable

torch.manual_seed(0)


class FPN50(nn.Module):
    def __init__(self):
        super(FPN50, self).__init__()
        self.conv1 = nn.Conv2d(3, 8, kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 8, kernel_size=3, stride=2, padding=1)
        self.latlayer1 = nn.Conv2d(8, 8, kernel_size=1)
        self.toplayer = nn.Conv2d(8, 8, kernel_size=1)

    def forward(self, x):
        c1 = F.relu(self.conv1(x))
        c2 = F.relu(self.conv2(c1))
        p2 = self.toplayer(c2)
        p1 = F.interpolate(p2, scale_factor=2) + self.latlayer1(c1)
        return p1, p2


class RetinaNet(nn.Module):
    num_anchors = 9
    num_classes = 20

    def __init__(self):
        super(RetinaNet, self).__init__()
        self.fpn = FPN50()
        self.loc_head = self._make_head(self.num_anchors*4)
        self.cls_head = self._make_head(self.num_anchors*self.num_classes)

    def forward(self, x):
        fms = self.fpn(x)
        loc_preds = []
        cls_preds = []
        for fm in fms:
            loc_pred = self.loc_head(fm)
            cls_pred = self.cls_head(fm)
            loc_pred = loc_pred.permute(0,2,3,1).contiguous().view(x.size(0),-1,4)                 # [N, 9*4,H,W] -> [N,H,W, 9*4] -> [N,H*W*9, 4]
            cls_pred = cls_pred.permute(0,2,3,1).contiguous().view(x.size(0),-1,self.num_classes)  # [N,9*20,H,W] -> [N,H,W,9*20] -> [N,H*W*9,20]
            loc_preds.append(loc_pred)
            cls_preds.append(cls_pred)
        return torch.cat(loc_preds,1), torch.cat(cls_preds,1)

    def _make_head(self, out_planes):
        layers = []
        for _ in range(2):
            layers.append(nn.Conv2d(8, 8, kernel_size=3, stride=1, padding=1))
            layers.append(nn.ReLU(True))
        layers.append(nn.Conv2d(8, out_planes, kernel_size=3, stride=1, padding=1))
        return nn.Sequential(*layers)


def test():
    net = RetinaNet()
    loc_preds, cls_preds = net(Variable(torch.randn(2,3,32,32)))
    print(loc_preds.size())
    print(cls_preds.size())
    loc_grads = Variable(torch.randn(loc_preds.size()))
    cls_grads = Variable(torch.randn(cls_preds.size()))
    loc_preds.backward(loc_grads)
    cls_preds.backward(cls_grads)


test()
