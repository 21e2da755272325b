# Reproduction of https://github.com/pytorch/examples/pull/779 (word_language_model/main.py manual SGD step).
import torch
from torch import nn

torch.manual_seed(0)
ntokens, emsize, nhid = 20, 8, 8


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(ntokens, emsize)
        self.rnn = nn.LSTM(emsize, nhid)
        self.decoder = nn.Linear(nhid, ntokens)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.encoder(input), hidden)
        return self.decoder(output), hidden


model = RNNModel()
criterion = nn.CrossEntropyLoss()
lr = 20
clip = 0.25
data = torch.randint(0, ntokens, (6, 2))
targets = torch.randint(0, ntokens, (6 * 2,))
hidden = (torch.zeros(1, 2, nhid), torch.zeros(1, 2, nhid))
model.zero_grad()
output, hidden = model(data, hidden)
loss = criterion(output.view(-1, ntokens), targets)
loss.backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
for p in model.parameters():
    p.add_(-lr, p.grad)
print(loss.item())
