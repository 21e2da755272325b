# Reproduction of https://github.com/chxy95/Deep-Mutual-Learning/issues/5 (train.py: outputs of all models are
# computed once, then each model is updated with cross-entropy plus KL towards the others' outputs).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class KLLoss(nn.Module):
    def __init__(self):
        super(KLLoss, self).__init__()

    def forward(self, pred, label):
        T = 3
        predict = F.log_softmax(pred / T, dim=1)
        target_data = F.softmax(label / T, dim=1)
        target_data = target_data + 10 ** (-7)
        target = target_data
        loss = T * T * ((target * (target.log() - predict)).sum(1).sum() / target.size()[0])
        return loss


num_models = 2
models = [nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 10)) for _ in range(num_models)]
optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
criterion_CE, criterion_KLD = nn.CrossEntropyLoss(), KLLoss()

for step in range(2):
    images, labels = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    outputs = []
    for model in models:
        outputs.append(model(images))
    for i in range(num_models):
        ce_loss = criterion_CE(outputs[i], labels)
        kl_loss = 0
        for j in range(num_models):
            if i != j:
                kl_loss += criterion_KLD(outputs[i], outputs[j].detach())
        loss = ce_loss + kl_loss / (num_models - 1)
        optimizers[i].zero_grad()
        loss.backward()
        optimizers[i].step()
print(loss.item())
