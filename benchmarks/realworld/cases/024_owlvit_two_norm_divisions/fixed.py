# Reproduction of https://github.com/huggingface/transformers/pull/24529 (fixes #24525; OwlViTClassPredictionHead.forward).
import torch
from torch import nn

torch.manual_seed(0)


class OwlViTClassPredictionHead(nn.Module):
    def __init__(self, out_dim=8, query_dim=6):
        super().__init__()
        self.dense0 = nn.Linear(query_dim, out_dim)
        self.logit_shift = nn.Linear(query_dim, 1)
        self.logit_scale = nn.Linear(query_dim, 1)
        self.elu = nn.ELU()

    def forward(self, image_embeds, query_embeds):
        image_class_embeds = self.dense0(image_embeds)

        # Normalize image and text features
        image_class_embeds = image_class_embeds / (torch.linalg.norm(image_class_embeds, dim=-1, keepdim=True) + 1e-6)
        query_embeds = query_embeds / (torch.linalg.norm(query_embeds, dim=-1, keepdim=True) + 1e-6)

        # Get class predictions
        pred_logits = torch.einsum("...pd,...qd->...pq", image_class_embeds, query_embeds)

        # Apply a learnable shift and scale to logits
        logit_shift = self.logit_shift(image_embeds)
        logit_scale = self.logit_scale(image_embeds)
        logit_scale = self.elu(logit_scale) + 1
        pred_logits = (pred_logits + logit_shift) * logit_scale
        return (pred_logits, image_class_embeds)


head = OwlViTClassPredictionHead()
text_proj = nn.Linear(5, 8)
image_embeds = torch.randn(2, 4, 6)
query_embeds = text_proj(torch.randn(2, 3, 5))
pred_logits, _ = head(image_embeds, query_embeds)
loss = pred_logits.sigmoid().mean()
loss.backward()
print(loss.item())
