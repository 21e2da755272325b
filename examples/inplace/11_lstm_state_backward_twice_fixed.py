# Fixed (truncated backpropagation through time): detach the carried state, so each backward covers
# only its own chunk.
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
    state = tuple(s.detach() for s in state)
    loss = head(out).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"loss={loss.item():.4f}")
