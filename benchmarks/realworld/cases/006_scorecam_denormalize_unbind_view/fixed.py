# Reproduction of https://github.com/haofanwang/Score-CAM/issues/28 (utils/__init__.py denormalize, also flashtorch#42).
import torch
from torch import nn

torch.manual_seed(0)


def denormalize(tensor):
    means = [0.485, 0.456, 0.406]
    stds = [0.229, 0.224, 0.225]

    denormalized = tensor.detach().clone()

    for channel, mean, std in zip(denormalized[0], means, stds):
        channel.mul_(std).add_(mean)

    return denormalized


model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))
input_ = torch.randn(1, 3, 8, 8, requires_grad=True)
score = model(input_)[0, 2]
score.backward()
saliency = input_.grad.abs().max(dim=1)[0]
image = denormalize(input_)
print(saliency.shape, image.shape)
