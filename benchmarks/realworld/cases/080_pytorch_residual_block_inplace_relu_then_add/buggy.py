# Reproduction of https://github.com/pytorch/pytorch/issues/5687 (the reporter's ResidualBlock; in 2018 the loss
# silently diverged, current PyTorch raises at backward).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class ResidualBlock(nn.Module):
    def __init__(self, ch_in, ch_out, shortcut = None):
        super(ResidualBlock, self).__init__()
        self.left = nn.Sequential(
            nn.Conv2d(ch_in, 32, 3, 1, 1),  # ch_in, ch_out, kernel_size, stride, pad
            nn.ReLU(inplace=True),
            nn.Conv2d(32, ch_out, 3, 1, 1),
            nn.ReLU(inplace=True),
        )
        self.right = shortcut

    def forward(self, x):
        out = self.left(x)
        residual = x if self.right is None else self.right(x)
        out += residual
        return F.relu(out, inplace=False)


model = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), ResidualBlock(16, 16), nn.Conv2d(16, 3, 3, 1, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(2, 3, 8, 8)
loss = F.mse_loss(model(x), x)
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
