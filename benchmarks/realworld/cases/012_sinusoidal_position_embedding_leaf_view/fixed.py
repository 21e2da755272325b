# Reproduction of https://github.com/Atcold/NYU-DLSP20/issues/765 (15-transformer notebook, Embeddings).
import numpy as np
import torch
from torch import nn

device = "cpu"


def create_sinusoidal_embeddings(nb_p, dim, E):
    theta = np.array([
        [p / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)]
        for p in range(nb_p)
    ])
    E.requires_grad = False
    E[:, 0::2] = torch.FloatTensor(np.sin(theta[:, 0::2]))
    E[:, 1::2] = torch.FloatTensor(np.cos(theta[:, 1::2]))
    E = E.to(device)


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab_size, max_position_embeddings, p):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, d_model, padding_idx=1)
        self.position_embeddings = nn.Embedding(max_position_embeddings, d_model)
        create_sinusoidal_embeddings(
            nb_p=max_position_embeddings,
            dim=d_model,
            E=self.position_embeddings.weight
        )
        self.LayerNorm = nn.LayerNorm(d_model, eps=1e-12)


model = Embeddings(d_model=32, vocab_size=50, max_position_embeddings=16, p=0.1)
print(model.position_embeddings.weight[1, :4])
