# Reproduction of https://github.com/adambielski/siamese-triplet/issues/51 (networks.py EmbeddingNet and
# EmbeddingNetL2, trained with TripletNet and TripletLoss from losses.py; MNIST-sized random input).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class EmbeddingNet(nn.Module):
    def __init__(self):
        super(EmbeddingNet, self).__init__()
        self.convnet = nn.Sequential(nn.Conv2d(1, 32, 5), nn.PReLU(), nn.MaxPool2d(2, stride=2),
                                     nn.Conv2d(32, 64, 5), nn.PReLU(), nn.MaxPool2d(2, stride=2))
        self.fc = nn.Sequential(nn.Linear(64 * 4 * 4, 256), nn.PReLU(), nn.Linear(256, 256), nn.PReLU(),
                                nn.Linear(256, 128))

    def forward(self, x):
        output = self.convnet(x)
        output = output.view(output.size()[0], -1)
        output = self.fc(output)
        return output


class EmbeddingNetL2(EmbeddingNet):
    def __init__(self):
        super(EmbeddingNetL2, self).__init__()

    def forward(self, x):
        output = super(EmbeddingNetL2, self).forward(x)
        output /= output.pow(2).sum(1, keepdim=True).sqrt()
        return output


class TripletNet(nn.Module):
    def __init__(self, embedding_net):
        super(TripletNet, self).__init__()
        self.embedding_net = embedding_net

    def forward(self, x1, x2, x3):
        return self.embedding_net(x1), self.embedding_net(x2), self.embedding_net(x3)


class TripletLoss(nn.Module):
    def __init__(self, margin):
        super(TripletLoss, self).__init__()
        self.margin = margin

    def forward(self, anchor, positive, negative, size_average=True):
        distance_positive = (anchor - positive).pow(2).sum(1)
        distance_negative = (anchor - negative).pow(2).sum(1)
        losses = F.relu(distance_positive - distance_negative + self.margin)
        return losses.mean() if size_average else losses.sum()


model = TripletNet(EmbeddingNetL2())
loss_fn = TripletLoss(1.)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = [torch.randn(4, 1, 28, 28) for _ in range(3)]
loss = loss_fn(*model(*data))
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
