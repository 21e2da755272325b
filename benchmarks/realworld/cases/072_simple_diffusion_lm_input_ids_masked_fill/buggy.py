# Reproduction of https://github.com/thorinf/simple-diffusion-lm/issues/2 (the reporter changed
# `input_ids.masked_fill(...)` into `input_ids.masked_fill_(...)` in the model's loss; model shrunk).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class DiffusionLM(nn.Module):
    def __init__(self, num_embeddings=20, embedding_dim=8, model_dim=16):
        super().__init__()
        self.embedding = nn.Embedding(num_embeddings, embedding_dim)
        self.project = nn.Linear(embedding_dim + 1, model_dim)
        self.encoder = nn.TransformerEncoderLayer(model_dim, nhead=2, dim_feedforward=32, batch_first=True)
        self.out = nn.Linear(model_dim, num_embeddings)

    def compute_loss(self, input_ids, diff_mask):
        x = self.embedding(input_ids)
        t = torch.rand(x.shape[0], 1, 1).expand(-1, x.shape[1], 1)
        noise = torch.randn_like(x) * t
        x_noised = torch.where(diff_mask[..., None], x + noise, x)
        logits = self.out(self.encoder(self.project(torch.cat([x_noised, t], -1))))
        input_ids.masked_fill_(torch.logical_not(diff_mask), -100)
        return F.cross_entropy(logits.transpose(1, 2), input_ids, ignore_index=-100)


model = DiffusionLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
input_ids = torch.randint(0, 20, (4, 6))
diff_mask = torch.rand(4, 6) < 0.5
loss = model.compute_loss(input_ids, diff_mask)
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
