# Reproduction of https://github.com/dropreg/R-Drop/issues/8 (rdrop_translation.py train_step and
# rdrop_cross_entropy_loss.py forward both call optimizer.backward(loss)).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Optimizer:
    def __init__(self, params):
        self._optimizer = torch.optim.Adam(params, lr=1e-3)

    def backward(self, loss):
        loss.backward()

    def step(self):
        self._optimizer.step()


class RegLabelSmoothedCrossEntropyCriterion:
    def __init__(self, alpha=5.0):
        self.alpha = alpha

    def compute_kl_loss(self, net_output, pad_mask=None):
        p, q = torch.split(F.log_softmax(net_output, dim=-1), net_output.size(0) // 2, dim=0)
        p_loss = F.kl_div(p, q, log_target=True, reduction='sum')
        q_loss = F.kl_div(q, p, log_target=True, reduction='sum')
        return (p_loss + q_loss) / 2

    def forward(self, model, sample, optimizer, reg_alpha, ignore_grad, reduce=True):
        sample_input = sample['net_input']
        sample_concat_input = torch.cat([sample_input, sample_input.clone()], 0)
        net_output = model(sample_concat_input)
        target = torch.cat([sample['target'], sample['target'].clone()], 0)
        loss = F.cross_entropy(net_output, target, reduction='sum')
        loss += reg_alpha * self.compute_kl_loss(net_output)
        if ignore_grad:
            loss *= 0
        else:
            optimizer.backward(loss)
        return loss, sample['target'].numel(), {}


class RDropTranslationTask:
    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        model.train()
        loss, sample_size, logging_output = criterion.forward(model, sample, optimizer, 5.0, ignore_grad)
        if ignore_grad:
            loss *= 0
        with torch.autograd.profiler.record_function("backward"):
            optimizer.backward(loss)
        return loss, sample_size, logging_output


model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.1), nn.Linear(8, 5))
optimizer = Optimizer(model.parameters())
task, criterion = RDropTranslationTask(), RegLabelSmoothedCrossEntropyCriterion()
sample = {'net_input': torch.randn(4, 6), 'target': torch.randint(0, 5, (4,))}
loss, _, _ = task.train_step(sample, model, criterion, optimizer, update_num=0)
optimizer.step()
print(loss.item())
