# Reproduction of https://github.com/acrarshin/RPNet/pull/6 (network.py before the pull request: IncUNet's encoder
# stages start with nn.LeakyReLU(0.2, inplace=True), and e2 applies it to en1, the output of an IncResBlock whose last
# op is a ReLU that saved its output; the ECG U-Net shrunk to three encoder and three decoder stages, channels /8).
import torch.nn as nn
import torch

torch.manual_seed(0)


class IncResBlock(nn.Module):
    def __init__(self, inplanes, planes, convstr=1, convsize=15, convpadding=7):
        super(IncResBlock, self).__init__()
        self.Inputconv1x1 = nn.Conv1d(inplanes, planes, kernel_size=1, stride=1, bias=False)
        self.conv1_1 = nn.Sequential(
            nn.Conv1d(in_channels=inplanes, out_channels=planes//4, kernel_size=convsize, stride=convstr, padding=convpadding),
            nn.BatchNorm1d(planes//4))
        self.conv1_2 = nn.Sequential(
            nn.Conv1d(inplanes, planes//4, kernel_size=1, stride=convstr, padding=0, bias=False),
            nn.BatchNorm1d(planes//4),
            nn.LeakyReLU(0.2,),
            nn.Conv1d(in_channels=planes//4, out_channels=planes//4, kernel_size=convsize+2, stride=convstr, padding=convpadding+1),
            nn.BatchNorm1d(planes//4))
        self.conv1_3 = nn.Sequential(
            nn.Conv1d(inplanes, planes//4, kernel_size=1, stride=convstr, padding=0, bias=False),
            nn.BatchNorm1d(planes//4),
            nn.LeakyReLU(0.2,),
            nn.Conv1d(in_channels=planes//4, out_channels=planes//4, kernel_size=convsize+4, stride=convstr, padding=convpadding+2),
            nn.BatchNorm1d(planes//4))
        self.conv1_4 = nn.Sequential(
            nn.Conv1d(inplanes, planes//4, kernel_size=1, stride=convstr, padding=0, bias=False),
            nn.BatchNorm1d(planes//4),
            nn.LeakyReLU(0.2,),
            nn.Conv1d(in_channels=planes//4, out_channels=planes//4, kernel_size=convsize+6, stride=convstr, padding=convpadding+3),
            nn.BatchNorm1d(planes//4))
        self.relu = nn.ReLU()

    def forward(self, x):
        residual = self.Inputconv1x1(x)

        c1 = self.conv1_1(x)
        c2 = self.conv1_2(x)
        c3 = self.conv1_3(x)
        c4 = self.conv1_4(x)

        out = torch.cat([c1,c2,c3,c4],1)
        out += residual
        out = self.relu(out)

        return out


class IncUNet(nn.Module):
    def __init__(self, in_shape):
        super(IncUNet, self).__init__()
        in_channels, height, width = in_shape
        self.e1 = nn.Sequential(
            nn.Conv1d(in_channels, 8, kernel_size=4, stride=2,padding=1),
            nn.BatchNorm1d(8),
            nn.LeakyReLU(0.2,),
            IncResBlock(8,8))
        self.e2 = nn.Sequential(
            nn.LeakyReLU(0.2,),
            nn.Conv1d(8, 16, kernel_size=4, stride=2,padding=1),
            nn.BatchNorm1d(16),
            IncResBlock(16,16))
        self.e2add = nn.Sequential(
            nn.Conv1d(16, 16, kernel_size=3, stride=1,padding=1),
            nn.BatchNorm1d(16))
        self.e3 = nn.Sequential(
            nn.LeakyReLU(0.2,),
            nn.Conv1d(16, 16, kernel_size=3, stride=1,padding=1),
            nn.BatchNorm1d(16),
            nn.LeakyReLU(0.2,),
            nn.Conv1d(16,32, kernel_size=4, stride=2,padding=1),
            nn.BatchNorm1d(32),
            IncResBlock(32,32))

        self.d8 = nn.Sequential(
            nn.LeakyReLU(0.2,),
            nn.ConvTranspose1d(32, 16, kernel_size=4, stride=2,padding=1),
            nn.BatchNorm1d(16))
        self.d9 = nn.Sequential(
            nn.LeakyReLU(0.2,),
            nn.ConvTranspose1d(32, 8, kernel_size=4, stride=2,padding=1),
            nn.BatchNorm1d(8))
        self.out_l = nn.Sequential(
            nn.LeakyReLU(0.2,),
            nn.ConvTranspose1d(16, in_channels, kernel_size=4, stride=2,padding=1))

    def forward(self, x):

        en1 = self.e1(x)
        en2 = self.e2(en1)
        en2add = self.e2add(en2)
        en3 = self.e3(en2add)

        de8_ = self.d8(en3)
        de8 = torch.cat([en2add,de8_],1)
        de9_ = self.d9(de8)
        de9 = torch.cat([en1,de9_],1)
        out = self.out_l(de9)

        return out


Net = IncUNet(in_shape=(1, 64, 1))
optimizer = torch.optim.Adam(Net.parameters(), lr=0.05)
loss_fn = nn.SmoothL1Loss()
ecg, target = torch.randn(4, 1, 64), torch.rand(4, 1, 64)
for epoch in range(2):
    predicted = Net(ecg)
    loss = loss_fn(predicted, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item())
