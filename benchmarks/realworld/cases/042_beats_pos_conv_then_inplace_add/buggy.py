# Reproduction of https://github.com/microsoft/unilm/pull/999 (beats/backbone.py line 116, TransformerEncoder.extract_features).
import torch
import torch.nn as nn

torch.manual_seed(0)


class SamePad(nn.Module):
    def __init__(self, kernel_size):
        super().__init__()
        self.remove = 1 if kernel_size % 2 == 0 else 0

    def forward(self, x):
        if self.remove > 0:
            x = x[:, :, : -self.remove]
        return x


class TransformerEncoder(nn.Module):
    def __init__(self, embedding_dim=8, conv_pos=4, conv_pos_groups=2):
        super().__init__()
        self.pos_conv = nn.Conv1d(embedding_dim, embedding_dim, kernel_size=conv_pos, padding=conv_pos // 2,
                                  groups=conv_pos_groups)
        self.pos_conv = nn.Sequential(self.pos_conv, SamePad(conv_pos), nn.GELU())
        self.layer_norm = nn.LayerNorm(embedding_dim)
        self.layer_norm_first = False
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(embedding_dim, 2, 16, 0.0, batch_first=True)])

    def extract_features(self, x, padding_mask=None):
        if padding_mask is not None:
            x[padding_mask] = 0
        x_conv = self.pos_conv(x.transpose(1, 2))
        x_conv = x_conv.transpose(1, 2)
        x += x_conv
        if not self.layer_norm_first:
            x = self.layer_norm(x)
        for layer in self.layers:
            x = layer(x)
        return x


post_extract_proj = nn.Linear(6, 8)
encoder = TransformerEncoder()
features = post_extract_proj(torch.randn(2, 10, 6))
padding_mask = torch.zeros(2, 10, dtype=torch.bool)
padding_mask[1, 8:] = True
x = encoder.extract_features(features, padding_mask)
loss = x.pow(2).mean()
loss.backward()
print(loss.item())
