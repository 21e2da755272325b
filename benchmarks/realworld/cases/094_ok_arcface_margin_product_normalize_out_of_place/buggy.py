# Correct program after https://github.com/ronghuaiyang/arcface-pytorch/issues/1 (models/metrics.py ArcMarginProduct:
# the weight is normalised out of place, so its gradient includes the normalisation).
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn import Parameter

torch.manual_seed(0)


class ArcMarginProduct(nn.Module):
    def __init__(self, in_features, out_features, s=30.0, m=0.50, easy_margin=False):
        super(ArcMarginProduct, self).__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.s = s
        self.m = m
        self.weight = Parameter(torch.FloatTensor(out_features, in_features))
        nn.init.xavier_uniform_(self.weight)

        self.easy_margin = easy_margin
        self.cos_m = math.cos(m)
        self.sin_m = math.sin(m)
        self.th = math.cos(math.pi - m)
        self.mm = math.sin(math.pi - m) * m

    def forward(self, input, label):
        cosine = F.linear(F.normalize(input), F.normalize(self.weight))
        sine = torch.sqrt((1.0 - torch.pow(cosine, 2)).clamp(0, 1))
        phi = cosine * self.cos_m - sine * self.sin_m
        if self.easy_margin:
            phi = torch.where(cosine > 0, phi, cosine)
        else:
            phi = torch.where(cosine > self.th, phi, cosine - self.mm)
        one_hot = torch.zeros(cosine.size())
        one_hot.scatter_(1, label.view(-1, 1).long(), 1)
        output = (one_hot * phi) + ((1.0 - one_hot) * cosine)
        output *= self.s
        return output


model = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(inplace=True), nn.Linear(32, 16))
metric_fc = ArcMarginProduct(16, 6, s=30, m=0.5)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD([{'params': model.parameters()}, {'params': metric_fc.parameters()}], lr=0.1)
for step in range(2):
    data_input, label = torch.randn(8, 20), torch.randint(0, 6, (8,))
    feature = model(data_input)
    output = metric_fc(feature, label)
    loss = criterion(output, label)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item())
