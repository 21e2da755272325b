# Correct program: torchvision AlexNet's layout (the model asked about in https://github.com/pytorch/vision/issues/807), shrunk.
import torch
import torch.nn as nn

torch.manual_seed(0)


class AlexNet(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, stride=1, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, kernel_size=3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.avgpool = nn.AdaptiveAvgPool2d((2, 2))
        self.classifier = nn.Sequential(
            nn.Dropout(), nn.Linear(8 * 2 * 2, 16), nn.ReLU(inplace=True),
            nn.Dropout(), nn.Linear(16, 16), nn.ReLU(inplace=True), nn.Linear(16, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


model = AlexNet()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss = nn.functional.cross_entropy(model(torch.randn(2, 3, 8, 8)), torch.tensor([1, 3]))
loss.backward()
opt.step()
print(loss.item())
