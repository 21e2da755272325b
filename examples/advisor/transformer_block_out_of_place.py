"""A pre-norm transformer block written out-of-place with named intermediates, and the in-place memory
advisor run on one training step (AdamW).

    python examples/advisor/transformer_block_out_of_place.py
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradguard


class Block(nn.Module):
    def __init__(self, d_model=64, heads=4, hidden=256):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def attention(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        scores = q @ k.transpose(-2, -1)
        scaled = scores / math.sqrt(d // self.heads)
        masked = scaled.masked_fill(mask, float("-inf"))
        probs = masked.softmax(dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(ctx)

    def forward(self, x, mask):
        attn = self.attention(self.ln1(x), mask)
        h = x + attn
        up = self.fc1(self.ln2(h))
        act = F.relu(up)
        down = self.fc2(act)
        out = h + down
        return out


def main(repeats=3):
    torch.manual_seed(0)
    batch, seq, d_model = 8, 128, 64
    block = Block(d_model)
    head = nn.Linear(d_model, d_model)
    opt = torch.optim.AdamW(list(block.parameters()) + list(head.parameters()), lr=1e-3)
    x = torch.randn(batch, seq, d_model)
    target = torch.randn(batch, seq, d_model)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)

    def train_step():
        opt.zero_grad()
        y = head(block(x, mask))
        loss = F.mse_loss(y, target)
        loss.backward()
        opt.step()
        return loss.detach()

    report = gradguard.advise(train_step, repeats=repeats)
    print(report)
    return report


if __name__ == "__main__":
    main()
