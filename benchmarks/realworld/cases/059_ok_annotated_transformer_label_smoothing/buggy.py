# Correct program: LabelSmoothing from https://nlp.seas.harvard.edu/annotated-transformer/ (in-place ops on x.data.clone()).
import torch
import torch.nn as nn

torch.manual_seed(0)


class LabelSmoothing(nn.Module):
    "Implement label smoothing."

    def __init__(self, size, padding_idx, smoothing=0.0):
        super(LabelSmoothing, self).__init__()
        self.criterion = nn.KLDivLoss(reduction="sum")
        self.padding_idx = padding_idx
        self.confidence = 1.0 - smoothing
        self.smoothing = smoothing
        self.size = size
        self.true_dist = None

    def forward(self, x, target):
        assert x.size(1) == self.size
        true_dist = x.data.clone()
        true_dist.fill_(self.smoothing / (self.size - 2))
        true_dist.scatter_(1, target.data.unsqueeze(1), self.confidence)
        true_dist[:, self.padding_idx] = 0
        mask = torch.nonzero(target.data == self.padding_idx)
        if mask.dim() > 0:
            true_dist.index_fill_(0, mask.squeeze(), 0.0)
        self.true_dist = true_dist
        return self.criterion(x, true_dist.clone().detach())


generator = nn.Linear(8, 6)
crit = LabelSmoothing(6, padding_idx=0, smoothing=0.1)
x = torch.log_softmax(generator(torch.randn(4, 8)), dim=-1)
loss = crit(x, torch.tensor([2, 1, 0, 3]))
loss.backward()
print(loss.item())
