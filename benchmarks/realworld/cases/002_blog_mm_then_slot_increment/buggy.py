# Reproduction of the example in https://www.yongfengli.tk/2018/04/13/inplace-operation-in-pytorch.html
import torch
from torch import nn
from torch.autograd import Variable

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.param = nn.Parameter(torch.randn(10, 10) * 0.1)

    def forward(self,a):
        b = Variable(torch.Tensor(10,1))
        y = 0
        b = torch.mm(self.param,a)
        for i in range(10):
            b[i] = b[i] + 1 #inpalce operation
            y = y + torch.mm(self.param,b)
        return y


net = Net()
a = torch.randn(10, 1)
y = net(a)
y.sum().backward()
print(net.param.grad.norm())
