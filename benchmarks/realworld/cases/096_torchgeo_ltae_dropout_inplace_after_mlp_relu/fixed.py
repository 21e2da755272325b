# Reproduction of https://github.com/torchgeo/torchgeo/issues/3735 (torchgeo/models/ltae.py before pull 3737: the
# L-TAE head ends with nn.Dropout(dropout, inplace=True) right after an MLP whose last layer is ReLU(inplace=True);
# the issue's own steps to reproduce, docstrings dropped).
import math
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor

torch.manual_seed(0)


class LTAE(nn.Module):
    def __init__(self, in_channels: int = 128, n_head: int = 16, d_k: int = 8, n_neurons: Sequence[int] = (256, 128),
                 dropout: float = 0.2, d_model: int | None = 256, T: int = 1000, len_max_seq: int = 24,
                 positions: Sequence[int] | None = None) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.positions = positions
        self.n_neurons = n_neurons
        self.d_model = d_model if d_model is not None else in_channels
        self.inconv: nn.Sequential | None = None

        if d_model is not None:
            self.inconv = nn.Sequential(nn.Conv1d(in_channels, d_model, 1), nn.LayerNorm([d_model, len_max_seq]))

        self.pos_encoder = PositionalEncoding(self.d_model, dropout, T)
        self.attention = nn.MultiheadAttention(embed_dim=self.d_model, num_heads=n_head, dropout=dropout,
                                               batch_first=True)
        self.inlayernorm = nn.LayerNorm(self.in_channels)
        self.outlayernorm = nn.LayerNorm(n_neurons[-1])

        assert self.n_neurons[0] == self.d_model

        activation = nn.ReLU(inplace=True)

        layers = []
        for i in range(len(self.n_neurons) - 1):
            layers.extend([nn.Linear(self.n_neurons[i], self.n_neurons[i + 1]),
                           nn.BatchNorm1d(self.n_neurons[i + 1]),
                           activation])

        self.mlp = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        sz_b, seq_len, d = x.shape

        x = self.inlayernorm(x)

        if self.inconv is not None:
            x = self.inconv(x.permute(0, 2, 1)).permute(0, 2, 1)

        x = self.pos_encoder(x)
        attention_output, _ = self.attention(x, x, x)

        mlp_input = attention_output.mean(dim=1)  # (batch_size, d_model)
        output: Tensor = self.outlayernorm(self.dropout(self.mlp(mlp_input)))

        return output


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.1, T: int = 1000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)

        position = torch.arange(T).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(T) / d_model))
        pe = torch.zeros(1, T, d_model)
        pe[0, :, 0::2] = torch.sin(position * div_term)
        pe[0, :, 1::2] = torch.cos(position * div_term)
        self.register_buffer('pe', pe)

    def forward(self, x: Tensor) -> Tensor:
        pe = self.pe[:, : x.size(1)]
        output: Tensor = self.dropout(x + pe)
        return output


model = LTAE(in_channels=16, d_model=16, n_head=4, n_neurons=(16, 32), len_max_seq=5)

x = torch.randn(2, 5, 16)

y = model(x)
loss = y.mean()
loss.backward()
print(loss.item())
