# Correct program after https://github.com/huanghoujing/AlignedReID-Re-Production-Pytorch/issues/42 (the asker's
# mutual-learning step: the peer's logits are detached, and net 1's prediction is recomputed after its update).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
Feat1, Feat2 = nn.Sequential(nn.Flatten(), nn.Linear(48, 256), nn.ReLU()), nn.Sequential(nn.Flatten(), nn.Linear(48, 256), nn.ReLU())
FC1, FC2 = nn.Linear(256, 10), nn.Linear(256, 10)
optimizer1 = torch.optim.SGD(list(Feat1.parameters()) + list(FC1.parameters()), lr=0.1, momentum=0.9)
optimizer2 = torch.optim.SGD(list(Feat2.parameters()) + list(FC2.parameters()), lr=0.1, momentum=0.9)

for step in range(2):
    inputs, labels = torch.randn(4, 3, 4, 4), torch.randint(0, 10, (4,))
    """compute p1 p2"""
    logits1 = FC1(Feat1(inputs).view(-1, 256))
    logits2 = FC2(Feat2(inputs).view(-1, 256))

    """update net1"""
    l1 = F.cross_entropy(logits1, labels)
    kl1 = F.kl_div(F.log_softmax(logits1, dim=1), F.softmax(logits2.detach(), dim=1), reduction='sum') / logits1.shape[0]
    loss1 = l1 + kl1

    optimizer1.zero_grad()
    loss1.backward()
    optimizer1.step()

    """compute p1"""
    logits1 = FC1(Feat1(inputs).view(-1, 256))

    """update net2"""
    l2 = F.cross_entropy(logits2, labels)
    kl2 = F.kl_div(F.log_softmax(logits2, dim=1), F.softmax(logits1.detach(), dim=1), reduction='sum') / logits2.shape[0]
    loss2 = l2 + kl2

    optimizer2.zero_grad()
    loss2.backward()
    optimizer2.step()
print(loss1.item(), loss2.item())
