# Reproduction of https://github.com/kanyun-inc/fairseq-gec/issues/45 (fairseq/modules/multihead_attention.py, self-attention path).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.in_proj_weight = nn.Parameter(torch.randn(3 * embed_dim, embed_dim) * 0.1)
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def in_proj_qkv(self, query):
        return self._in_proj(query).chunk(3, dim=-1)

    def _in_proj(self, input):
        return F.linear(input, self.in_proj_weight, self.in_proj_bias)

    def forward(self, query):
        tgt_len, bsz, embed_dim = query.size()
        q, k, v = self.in_proj_qkv(query)
        q *= self.scaling
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        attn_weights = F.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        attn = torch.bmm(attn_weights, v).transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn)


attn = MultiheadAttention(8, 2)
x = torch.randn(5, 2, 8)
loss = attn(x).pow(2).mean()
loss.backward()
print(loss.item())
