# Reproduction of https://github.com/Jee-King/TSAN/issues/3 (Train/model/tsan.py line 103: out = x --> out = x.clone()).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class make_dense(nn.Module):
    def __init__(self, n_channels, n_feats=4):
        super(make_dense, self).__init__()
        self.conv_1_1 = nn.Conv2d(n_channels, n_feats, 1, padding=0, stride=1)
        self.conv_3_1 = nn.Conv2d(n_feats, n_feats, 3, padding=1, stride=1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self,x):
        out1x1 = self.relu(self.conv_1_1(x))
        output = self.relu(self.conv_3_1(out1x1))
        output = torch.cat([output, x], 1)
        return output


class DRB(nn.Module):
    def __init__(self, n_channels, n_denselayer=1, n_feats=4):
        super(DRB, self).__init__()
        nChannels_ = n_channels
        modules = []
        for i in range(n_denselayer):
            modules.append(make_dense(nChannels_, n_feats))
            nChannels_ += n_feats
        self.dense_layers = nn.Sequential(*modules)
        self.conv_1x1 = nn.Conv2d(nChannels_, n_feats, kernel_size=1, padding=0, bias=False)

    def forward(self, x):
        out = self.dense_layers(x)
        out = self.conv_1x1(out)
        out = x + out
        return out


class CSB(nn.Module):
    def __init__(self, n_feats):
        super(CSB, self).__init__()
        self.conv1 = nn.Conv2d(n_feats*4, n_feats*4, kernel_size=1, padding=0, bias=False)

    def forward(self, x):
        f1 = x[:, : , 0:x.size(2)//2, 0:x.size(3)//2]
        f2 = x[:, : , x.size(2)//2:, 0:x.size(3)//2]
        f3 = x[:, : , 0:x.size(2)//2, x.size(3)//2:]
        f4 = x[:, : , x.size(2)//2:, x.size(3)//2:]
        f_all = torch.cat([f1,f2,f3,f4], 1)
        f_all = self.conv1(f_all)
        out = x.clone()
        out[:,:,0:x.size(2)//2, 0:x.size(3)//2] = f_all[:,0:f_all.size(1)//4,:,:]
        out[:,:,x.size(2)//2:, 0:x.size(3)//2] = f_all[:,f_all.size(1)//4:f_all.size(1)//2,:,:]
        out[:,:,0:x.size(2)//2, x.size(3)//2:] = f_all[:,f_all.size(1)//2:f_all.size(1)*3//4,:,:]
        out[:,:,x.size(2)//2:, x.size(3)//2:] = f_all[:,f_all.size(1)*3//4:,:,:]
        return out


class MCAB(nn.Module):
    def __init__(self, n_channels, n_denselayer=1, n_feats=4):
        super(MCAB, self).__init__()
        self.drb = DRB(n_channels, n_denselayer, n_feats)
        self.csb = CSB(n_feats)
        self.conv3 = nn.Conv2d(n_feats, n_feats, kernel_size=3, padding=1, bias=False)

    def forward(self, x):
        down_b = self.drb(x)
        top_b = self.csb(x)
        top_b = F.sigmoid(self.conv3(top_b))
        return down_b*top_b


first_conv = nn.Conv2d(3, 4, 1)
body = MCAB(n_channels=4, n_denselayer=1, n_feats=4)
x = torch.randn(1, 3, 8, 8)
first_out = F.relu(first_conv(x))
loss = body(first_out).mean()
loss.backward()
print(loss.item())
