# Reproduction of https://github.com/idiap/fast-transformers/pull/10 (recurrent/attention/self_attention/linear_attention.py before the PR).
import torch
from torch.nn import Module, Linear

torch.manual_seed(0)


def elu_feature_map(x):
    return torch.nn.functional.elu(x) + 1


class RecurrentLinearAttention(Module):
    def __init__(self, eps=1e-6):
        super(RecurrentLinearAttention, self).__init__()
        self.eps = eps

    def forward(self, query, key, value, state=None):
        Q = elu_feature_map(query)
        K = elu_feature_map(key)
        N, H, D = Q.shape
        _, _, M = value.shape
        if state is None:
            Si = query.new_zeros((N, H, D, M))
            Zi = query.new_zeros((N, H, D))
        else:
            Si, Zi = state
        Zi += K
        Si += torch.einsum("nhd,nhm->nhdm", K, value)
        Z = 1. / (torch.einsum("nhd,nhd->nh", Q, Zi) + self.eps)
        V = torch.einsum("nhd,nhdm,nh->nhm", Q, Si, Z)
        return V, [Si, Zi]


N, H, D = 2, 2, 4
proj = Linear(D, 3 * D)
attention = RecurrentLinearAttention()
state = None
outputs = []
for t in range(3):
    q, k, v = proj(torch.randn(N, H, D)).chunk(3, dim=-1)
    out, state = attention(q, k, v, state)
    outputs.append(out)
loss = torch.stack(outputs).pow(2).mean()
loss.backward()
print(loss.item())
