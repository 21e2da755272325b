# Reproduction of https://github.com/facebookresearch/svoice/issues/53 (svoice/models/sisnr_loss.py, line 46).
import torch
from torch import nn

torch.manual_seed(0)
EPS = 1e-8


def get_mask(source, source_lengths):
    B, _, T = source.size()
    mask = source.new_ones((B, 1, T))
    for i in range(B):
        mask[i, :, source_lengths[i]:] = 0
    return mask


def cal_si_snr(source, estimate_source, source_lengths):
    B, C, T = source.size()
    mask = get_mask(source, source_lengths)
    estimate_source *= mask
    zero_mean_target = source - source.mean(dim=2, keepdim=True)
    zero_mean_estimate = estimate_source - estimate_source.mean(dim=2, keepdim=True)
    dot = (zero_mean_estimate * zero_mean_target).sum(dim=2, keepdim=True)
    proj = dot * zero_mean_target / (zero_mean_target.pow(2).sum(dim=2, keepdim=True) + EPS)
    noise = zero_mean_estimate - proj
    return 10 * torch.log10(proj.pow(2).sum(2) / (noise.pow(2).sum(2) + EPS) + EPS)


def cal_loss(source, estimate_source, source_lengths):
    max_snr = cal_si_snr(source, estimate_source, source_lengths)
    loss = 0 - torch.mean(max_snr)
    return loss


model = nn.Conv1d(1, 2 * 2, 3, padding=1)   # 2 layers' estimates of 2 speakers
mixture = torch.randn(2, 1, 32)
sources = torch.randn(2, 2, 32)
lengths = torch.tensor([32, 28])
estimate_source = model(mixture).view(2, 2, 2, 32).transpose(0, 1)   # [layers, B, C, T]
loss = 0
for c_idx, est_src in enumerate(estimate_source):
    loss_i = cal_loss(sources, est_src, lengths)
    loss += loss_i
loss.backward()
print(loss.item())
