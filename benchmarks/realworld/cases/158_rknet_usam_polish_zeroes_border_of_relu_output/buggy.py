# Reproduction of https://github.com/AggMan96/RK-Net/issues/9 (training RK-Net fails with "one of the variables needed
# for gradient computation has been modified by an inplace operation: [torch.cuda.FloatTensor [8, 1, 96, 96]], which
# is output 0 of ReluBackward0": the USAM attention module, with polish=True, zeroes the border of its attention map
# with att[:, :, :, 0] = 0 ... on the output of self.relu, which ReLU saved for its backward. The fix from the thread
# is att = att.clone() under `if self.polish:`. model.py's USAM, ClassBlock, ft_net and two_view_net as in the
# repository; the torchvision resnet50 backbone is replaced by a small stand-in with the same attribute names
# (conv1/bn1/relu/maxpool/layer1-4, no pretrained weights); batch 2 at 64x64, a few SGD steps).
import torch
import torch.nn as nn
from torch.nn import init
from torch.nn import functional as F

torch.manual_seed(0)


######################################################################
class USAM(nn.Module):
    def __init__(self, kernel_size=3, padding=1, polish=True):
        super(USAM, self).__init__()

        kernel = torch.ones((kernel_size, kernel_size))
        kernel = kernel.unsqueeze(0).unsqueeze(0)
        self.weight = nn.Parameter(data=kernel, requires_grad=False)


        kernel2 = torch.ones((1, 1)) * (kernel_size * kernel_size)
        kernel2 = kernel2.unsqueeze(0).unsqueeze(0)
        self.weight2 = nn.Parameter(data=kernel2, requires_grad=False)

        self.polish = polish
        self.pad = padding
        self.relu = nn.ReLU()
        self.bn = nn.BatchNorm2d(1)

    def __call__(self, x):
        fmap = x.sum(1, keepdim=True)
        x1 = F.conv2d(fmap, self.weight, padding=self.pad)
        x2 = F.conv2d(fmap, self.weight2, padding=0)

        att = x2 - x1
        att = self.bn(att)
        att = self.relu(att)

        if self.polish:
            att[:, :, :, 0] = 0
            att[:, :, :, -1] = 0
            att[:, :, 0, :] = 0
            att[:, :, -1, :] = 0

        output = x + att * x

        return output


def weights_init_kaiming(m):
    classname = m.__class__.__name__
    # print(classname)
    if classname.find('Conv') != -1:
        init.kaiming_normal_(m.weight.data, a=0, mode='fan_in') # For old pytorch, you may use kaiming_normal.
    elif classname.find('Linear') != -1:
        init.kaiming_normal_(m.weight.data, a=0, mode='fan_out')
        init.constant_(m.bias.data, 0.0)
    elif classname.find('BatchNorm1d') != -1:
        init.normal_(m.weight.data, 1.0, 0.02)
        init.constant_(m.bias.data, 0.0)

def weights_init_classifier(m):
    classname = m.__class__.__name__
    if classname.find('Linear') != -1:
        init.normal_(m.weight.data, std=0.001)
        init.constant_(m.bias.data, 0.0)


# Defines the new fc layer and classification layer
# |--Linear--|--bn--|--relu--|--Linear--|
class ClassBlock(nn.Module):
    def __init__(self, input_dim, class_num, droprate, relu=False, bnorm=True, num_bottleneck=512, linear=True, return_f = False):
        super(ClassBlock, self).__init__()
        self.return_f = return_f
        add_block = []
        if linear:
            add_block += [nn.Linear(input_dim, num_bottleneck)]
        else:
            num_bottleneck = input_dim
        if bnorm:
            add_block += [nn.BatchNorm1d(num_bottleneck)]
        if relu:
            add_block += [nn.LeakyReLU(0.1)]
        if droprate>0:
            add_block += [nn.Dropout(p=droprate)]
        add_block = nn.Sequential(*add_block)
        add_block.apply(weights_init_kaiming)

        classifier = []
        classifier += [nn.Linear(num_bottleneck, class_num)]
        classifier = nn.Sequential(*classifier)
        classifier.apply(weights_init_classifier)

        self.add_block = add_block
        self.classifier = classifier
    def forward(self, x):
        x = self.add_block(x)
        if self.return_f:
            f = x
            x = self.classifier(x)
            return x,f
        else:
            x = self.classifier(x)
            return x


class TinyResNet(nn.Module):  # stand-in for models.resnet50(pretrained=True)
    def __init__(self, width=8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        def stage(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
        self.layer1 = stage(width, 16, 1)
        self.layer2 = stage(16, 32, 2)
        self.layer3 = stage(32, 32, 2)
        self.layer4 = stage(32, 64, 2)


# Define the ResNet50-based Model
class ft_net(nn.Module):

    def __init__(self, class_num, droprate=0.5, stride=2, init_model=None, pool='avg'):
        super(ft_net, self).__init__()
        model_ft = TinyResNet()

        self.pool = pool
        if pool=='avg':
            model_ft.avgpool2 = nn.AdaptiveAvgPool2d((1,1))

        self.model = model_ft

        self.usam_1 = USAM()
        self.usam_2 = USAM()

    def forward(self, x):
        x = self.model.conv1(x)
        x = self.model.bn1(x)
        x = self.model.relu(x)
        x = self.usam_1(x)
        x = self.model.maxpool(x)
        x = self.model.layer1(x)
        x = self.usam_2(x)
        x = self.model.layer2(x)
        x = self.model.layer3(x)
        x = self.model.layer4(x)

        if self.pool == 'avg':
            x = self.model.avgpool2(x)

        x = x.view(x.size(0), x.size(1))
        #x = self.classifier(x)
        return x

class two_view_net(nn.Module):
    def __init__(self, class_num, droprate, stride = 2, pool = 'avg', share_weight = False, VGG16=False):
        super(two_view_net, self).__init__()
        self.model_1 =  ft_net(class_num, stride=stride, pool = pool)
        if share_weight:
            self.model_2 = self.model_1
        else:
            self.model_2 =  ft_net(class_num, stride = stride, pool = pool)

        self.classifier = ClassBlock(64, class_num, droprate, num_bottleneck=32)

    def forward(self, x1, x2):
        if x1 is None:
            y1 = None
        else:
            x1 = self.model_1(x1)
            y1 = self.classifier(x1)

        if x2 is None:
            y2 = None
        else:
            x2 = self.model_2(x2)
            y2 = self.classifier(x2)
        return y1, y2


class_num = 10
model = two_view_net(class_num, droprate=0.5, share_weight=True)
criterion = nn.CrossEntropyLoss()
optimizer_ft = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model.train()
for step in range(2):
    inputs = torch.randn(2, 3, 64, 64)
    inputs2 = torch.randn(2, 3, 64, 64)
    labels = torch.randint(0, class_num, (2,))
    labels2 = labels.clone()
    optimizer_ft.zero_grad()
    outputs, outputs2 = model(inputs, inputs2)
    loss = criterion(outputs, labels) + criterion(outputs2, labels2)
    loss.backward()
    optimizer_ft.step()
    print(step, loss.item())
