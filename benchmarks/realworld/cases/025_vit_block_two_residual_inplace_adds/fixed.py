# Reproduction of the block in https://github.com/vllm-project/vllm/pull/24500 (midashenglm.py, "Prefer in-place add"), trained.
import torch
from torch import nn

torch.manual_seed(0)


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-1):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class Attention(nn.Module):
    def __init__(self, dim, num_heads=2):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)

    def forward(self, x, mask=None):
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


class Block(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim)
        self.ls1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 16), nn.GELU(), nn.Linear(16, dim))
        self.ls2 = LayerScale(dim)

    def forward(
        self,
        x: torch.Tensor,
        mask=None,
    ) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), mask))
        x = x + self.ls2(self.mlp(self.norm2(x)))
        return x


embed = nn.Linear(4, 8)
block = Block()
tokens = torch.randn(2, 5, 4)
out = block(embed(tokens))
loss = out.pow(2).mean()
loss.backward()
print(loss.item())
