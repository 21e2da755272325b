# Reproduction of https://discuss.pytorch.org/t/when-would-the-error-one-of-the-variables-needed-for-gradient-computation-has-been-modified-occur/11976
# (the poster bifurcates the data flow: conv1_p reads x for a side branch, then the main branch adds into x with +=;
# the thread gives the three lines, the module around them is reconstructed with the poster's names).
import torch
import torch.nn as nn

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv1_p = nn.Conv2d(8, 4, 3, padding=1)
        self.conv_skip = nn.Conv2d(3, 8, 1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, input):
        some_layer = self.conv_skip(input)
        x = self.conv1(input)  # main branch
        x_p = self.conv1_p(x)  # another branch
        x += some_layer  # main branch
        return self.head(x) + x_p


net = Net()
optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
input = torch.randn(2, 3, 8, 8)
target = torch.randn(2, 4, 8, 8)

optimizer.zero_grad()
loss = nn.functional.mse_loss(net(input), target)
loss.backward()
optimizer.step()
print(loss.item())
