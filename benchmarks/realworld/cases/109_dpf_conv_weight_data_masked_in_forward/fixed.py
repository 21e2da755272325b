# Reproduction of https://github.com/INCHEON-CHO/Dynamic_Model_Pruning_with_Feedback/issues/1 (models/resnet.py: every
# forward overwrites each conv's weight with weight * mask through .data, so the dense weights that Dynamic Pruning with
# Feedback must keep updating are destroyed silently and the masked-out entries can never come back; the maintainer
# acknowledged it and moved to a straight-through Masker autograd function. ResNet-20 for CIFAR shrunk to one
# BasicBlock per stage and 8x8 inputs; utils.sparsify written out as a global magnitude threshold).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Masker(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask):
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super(BasicBlock, self).__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.mask1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.mask1.weight.data = torch.ones(self.mask1.weight.size())
        self.bn1 = nn.BatchNorm2d(planes)

        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.mask2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.mask2.weight.data = torch.ones(self.mask2.weight.size())
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1._conv_forward(x, Masker.apply(self.conv1.weight, self.mask1.weight), None)))
        out = self.bn2(self.conv2._conv_forward(out, Masker.apply(self.conv2.weight, self.mask2.weight), None))
        out += self.shortcut(x)
        out = F.relu(out)
        return out

    def __prune__(self, threshold):
        self.mask1.weight.data = torch.gt(torch.abs(self.conv1.weight), threshold).float()
        self.mask2.weight.data = torch.gt(torch.abs(self.conv2.weight), threshold).float()


class ResNet(nn.Module):
    def __init__(self, block, num_blocks, data='cifar10'):
        super(ResNet, self).__init__()
        self.in_planes = 4
        self.out_planes = 4
        self.num_classes = int(data[5:])
        self.conv1 = nn.Conv2d(3, self.out_planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.mask1 = nn.Conv2d(3, self.out_planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.mask1.weight.data = torch.ones(self.mask1.weight.size())
        self.bn1 = nn.BatchNorm2d(self.out_planes)
        self.layer1 = self._make_layer(block, self.out_planes, num_blocks[0], stride=1)
        self.linear = nn.Linear(self.out_planes * block.expansion, self.num_classes)

    def _make_layer(self, block, planes, num_blocks, stride):
        strides = [stride] + [1] * (num_blocks - 1)
        layers = []
        for stride in strides:
            layers.append(block(self.in_planes, planes, stride))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1._conv_forward(x, Masker.apply(self.conv1.weight, self.mask1.weight), None)))
        out = self.layer1(out)
        out = F.avg_pool2d(out, out.size(3))
        out = out.view(out.size(0), -1)
        out = self.linear(out)
        return out

    def __prune__(self, threshold):
        self.mask1.weight.data = torch.gt(torch.abs(self.conv1.weight), threshold).float()
        for sub_block in self.layer1:
            sub_block.__prune__(threshold)


def sparsify(model, prune_rate=50.):
    weights = torch.cat([w.detach().abs().flatten() for name, w in model.named_parameters()
                         if 'conv' in name and 'weight' in name])
    threshold = torch.quantile(weights, prune_rate / 100.)
    model.__prune__(threshold)
    return model


model = ResNet(BasicBlock, [1], 'cifar10')
optimizer = torch.optim.SGD([w for name, w in model.named_parameters() if not 'mask' in name], lr=0.2, momentum=0.9)
criterion = nn.CrossEntropyLoss()
model = sparsify(model, 50.)
for step in range(2):
    inputs, targets = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    outputs = model(inputs)
    loss = criterion(outputs, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item(), (model.conv1.weight == 0).float().mean().item())
