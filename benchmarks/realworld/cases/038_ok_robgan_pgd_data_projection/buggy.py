# Correct program: attack_Linf_PGD from https://github.com/xuanqing94/RobGAN/issues/8 (Linf_SGD replaced by SGD on the sign).
import torch
import torch.nn as nn
from torch.autograd import Variable

torch.manual_seed(0)


def attack_Linf_PGD(input_v, label_v, dis, Ld, steps, epsilon):
    dis.eval()
    adverse_v = input_v.data.clone()
    adverse_v = Variable(adverse_v, requires_grad=True)
    optimizer = torch.optim.SGD([adverse_v], lr=0.0078)
    for _ in range(steps):
        optimizer.zero_grad()
        dis.zero_grad()
        d_multi = dis(adverse_v)
        loss = -Ld(d_multi, label_v)
        loss.backward()
        adverse_v.grad.sign_()
        optimizer.step()
        diff = adverse_v.data - input_v.data
        diff.clamp_(-epsilon, epsilon)
        adverse_v.data.copy_((diff + input_v.data).clamp_(-1, 1))
    dis.train()
    dis.zero_grad()
    return adverse_v


dis = nn.Sequential(nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 3))
x = torch.rand(4, 6) * 2 - 1
y = torch.tensor([0, 1, 2, 1])
x_adv = attack_Linf_PGD(x, y, dis, nn.functional.cross_entropy, steps=3, epsilon=0.03)
print((x_adv - x).abs().max().item())
