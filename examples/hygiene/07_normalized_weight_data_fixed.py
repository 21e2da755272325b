"""The fix for 07: the weight normalised in the graph (`w = F.normalize(self.w, dim=0)`), used as a new tensor.

    gradguard run --mode forensic examples/hygiene/07_normalized_weight_data_fixed.py
"""

import torch
import torch.nn.functional as F
from torch import nn


class CosineHead(nn.Module):
    def __init__(self, feat_dim, num_class, scale=16.0):
        super().__init__()
        self.w = nn.Parameter(torch.randn(feat_dim, num_class))
        self.scale = scale

    def forward(self, x, y):
        w = F.normalize(self.w, dim=0)
        logits = self.scale * F.normalize(x, dim=1) @ w
        return F.cross_entropy(logits, y)


torch.manual_seed(0)
backbone = nn.Linear(8, 6)
head = CosineHead(6, 4)
x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
w0 = head.w.detach().clone()
head(backbone(x), y).backward()

w = w0.clone().requires_grad_()
F.cross_entropy(16.0 * F.normalize(backbone(x), dim=1) @ F.normalize(w, dim=0), y).backward()
print("gradient of w matches the normalised loss:", torch.allclose(head.w.grad, w.grad, atol=1e-6))
