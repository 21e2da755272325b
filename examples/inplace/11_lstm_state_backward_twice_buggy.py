# An LSTM trained on chunks of a sequence, carrying (h, c) from chunk to chunk without detaching.
# The second backward runs into the first chunk's graph, which the first backward already freed.
# mlech26l/ncps#62, vikrant7/mobile-vod-bottleneck-lstm#25.
import torch
from torch import nn

torch.manual_seed(0)
lstm = nn.LSTM(input_size=3, hidden_size=5)
head = nn.Linear(5, 1)
opt = torch.optim.SGD([*lstm.parameters(), *head.parameters()], lr=0.1)
sequence = torch.randn(12, 1, 3)
state = None
for chunk in sequence.split(4):
    out, state = lstm(chunk, state)
    loss = head(out).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"loss={loss.item():.4f}")
