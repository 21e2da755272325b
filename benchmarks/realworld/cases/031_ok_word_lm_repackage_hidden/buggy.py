# Correct program: the training loop of https://github.com/pytorch/examples/blob/main/word_language_model/main.py (shrunk).
import torch
import torch.nn as nn

torch.manual_seed(0)
ntokens, emsize, nhid, bptt, lr = 20, 8, 8, 4, 20


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntokens, emsize)
        self.rnn = nn.LSTM(emsize, nhid)
        self.decoder = nn.Linear(nhid, ntokens)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)).view(-1, ntokens), hidden


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


model = RNNModel()
criterion = nn.NLLLoss()
train_data = torch.randint(0, ntokens, (13, 2))
hidden = (torch.zeros(1, 2, nhid), torch.zeros(1, 2, nhid))
for i in range(0, train_data.size(0) - 1, bptt):
    seq_len = min(bptt, len(train_data) - 1 - i)
    data, targets = train_data[i:i+seq_len], train_data[i+1:i+1+seq_len].view(-1)
    model.zero_grad()
    hidden = repackage_hidden(hidden)
    output, hidden = model(data, hidden)
    loss = criterion(torch.log_softmax(output, dim=-1), targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
print(loss.item())
