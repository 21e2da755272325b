# Reproduction of https://github.com/yunjey/pytorch-tutorial/issues/90 (language_model/main.py without the detach line).
import torch
import torch.nn as nn

torch.manual_seed(0)
embed_size = 8
hidden_size = 16
num_layers = 1
seq_length = 5
batch_size = 2
vocab_size = 30
ids = torch.randint(0, vocab_size, (batch_size, 4 * seq_length + 1))
num_batches = ids.size(1) // seq_length


class RNNLM(nn.Module):
    def __init__(self, vocab_size, embed_size, hidden_size, num_layers):
        super(RNNLM, self).__init__()
        self.embed = nn.Embedding(vocab_size, embed_size)
        self.lstm = nn.LSTM(embed_size, hidden_size, num_layers, batch_first=True)
        self.linear = nn.Linear(hidden_size, vocab_size)

    def forward(self, x, h):
        x = self.embed(x)
        out, (h, c) = self.lstm(x, h)
        out = out.reshape(out.size(0)*out.size(1), out.size(2))
        out = self.linear(out)
        return out, (h, c)


model = RNNLM(vocab_size, embed_size, hidden_size, num_layers)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=0.002)

states = (torch.zeros(num_layers, batch_size, hidden_size),
          torch.zeros(num_layers, batch_size, hidden_size))
for i in range(0, ids.size(1) - seq_length, seq_length):
    inputs = ids[:, i:i+seq_length]
    targets = ids[:, (i+1):(i+1)+seq_length]
    outputs, states = model(inputs, states)
    loss = criterion(outputs, targets.reshape(-1))
    model.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()
print(loss.item())
