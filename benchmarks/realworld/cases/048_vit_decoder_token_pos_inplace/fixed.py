# Reproduction of https://github.com/thuanz123/enhancing-transformers/issues/11 (enhancing/modules/stage1/layers.py line 210).
import torch
import torch.nn as nn

torch.manual_seed(0)


class ViTDecoder(nn.Module):
    def __init__(self, num_tokens=4, dim=8, out_dim=6):
        super().__init__()
        self.de_pos_embedding = nn.Parameter(torch.randn(1, num_tokens, dim) * 0.02)
        self.transformer = nn.TransformerEncoderLayer(dim, 2, 16, 0.0, batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(dim)
        self.to_pixel = nn.Linear(dim, out_dim)

    def forward(self, token):
        token = token + self.de_pos_embedding
        x = self.transformer(token)
        x = self.norm(x)
        return self.to_pixel(x)


encoder = nn.Linear(6, 8)
decoder_a = ViTDecoder()
decoder_b = ViTDecoder()
quant = encoder(torch.randn(2, 4, 6))
rec_a = decoder_a(quant)
rec_b = decoder_b(quant)
loss = rec_a.pow(2).mean() + rec_b.pow(2).mean()
loss.backward()
print(loss.item())
