# Reproduction of https://www.zhihu.com/question/482747456 (a Zhihu question: two losses share s = a * w1, and the
# loop runs loss1.backward(retain_graph=True); optim.step(); loss2.backward(retain_graph=True); optim.step(). The
# second backward fails only on the second pass of the while loop ("why not the first?"): the first step after
# loss1 skips w3, which has no grad yet; from the second pass on w3.grad is a zeroed tensor, so that step rewrites w3
# in place, and d = s * self.w3 saved w3 for loss2. The asker's code (copied into two public repositories) ran on
# PyTorch 1.x, where zero_grad() zeroed the grads; zero_grad(set_to_none=False) keeps that behaviour, and the
# endless while loop is bounded; its torch.autograd.set_detect_anomaly(True) line is dropped, as it is global state).
import torch
from torch import nn

torch.manual_seed(0)


class Model(torch.nn.Module):
    def __init__(self):
        super(Model, self).__init__()
        self.w1 = nn.Parameter(torch.tensor([2.], requires_grad=True))
        self.w2 = nn.Parameter(torch.tensor([3.], requires_grad=True))
        self.w3 = nn.Parameter(torch.tensor([4.], requires_grad=True))

    def forward(self, a):
        s = a * self.w1

        c = s * self.w2
        d = s * self.w3

        return c, d


x = torch.tensor([1.])
y1 = torch.tensor([10.])
y2 = torch.tensor([12.])

model = Model()
mse = torch.nn.MSELoss()
# optim = torch.optim.Adam(model.parameters(), lr=0.5)
optim = torch.optim.SGD(model.parameters(), lr=0.1)

num = 0
while num < 3:
    num += 1
    print(num)
    y1_pred, y2_pred = model(x)
    loss1 = mse(y1_pred, y1)
    loss2 = mse(y2_pred, y2)

    optim.zero_grad(set_to_none=False)
    loss1.backward(retain_graph=True)
    optim.step()

    optim.zero_grad(set_to_none=False)
    loss2.backward(retain_graph=True)  # 报错行！while循环第二次运行到这里才会报错。为什么第一次不报错？
    optim.step()
