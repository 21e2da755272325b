# Reproduction of https://blog.youkuaiyun.com/windhawk_fly/article/details/143405685 (a CSDN blog post: an LSTM
# experiment keeps h0, c0 from one batch to the next without detaching them; the first error, "Trying to backward
# through the graph a second time", was answered with retain_graph=True, which turned it into "modified by an
# inplace operation: [torch.FloatTensor [128, 6]] ... is at version 2; expected version 1" once optimizer.step()
# updated the LSTM weights the old graph had saved. The post's training loop as written, data shrunk).
import torch
import torch.nn as nn

torch.manual_seed(0)

EPOCH = 1
num_layers = 1
batch_size = 4
seq_len = 5
embedding_dim = 6
hidden_dim = 32


class LSTMModel(nn.Module):
    def __init__(self, embedding_dim, hidden_dim, num_layers):
        super().__init__()
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_dim, embedding_dim)

    def forward(self, x, h0, c0):
        out, (h, c) = self.lstm(x, (h0, c0))
        return self.fc(out), (h, c)


data_loader = [(torch.randn(batch_size, seq_len, embedding_dim), torch.randn(batch_size * seq_len, embedding_dim))
               for _ in range(4)]
batch_count = len(data_loader)
lstm = LSTMModel(embedding_dim, hidden_dim, num_layers)
loss_fn = nn.MSELoss()
optimizer = torch.optim.Adam(lstm.parameters(), lr=1e-3)

for epoch in range(EPOCH):
    batch_num = 0
    h0 = torch.randn((num_layers, batch_size, hidden_dim), requires_grad=False)
    c0 = torch.randn((num_layers, batch_size, hidden_dim), requires_grad=False)
    for batch in data_loader:
        optimizer.zero_grad()
        output, (h0, c0) = lstm(batch[0], h0, c0)
        h0, c0 = h0.detach(), c0.detach()
        loss = loss_fn(output.reshape(-1, embedding_dim), batch[1])
        loss.backward()
        optimizer.step()
        batch_num += 1
        if (batch_num) % min(10, batch_count // 2) == 0:
            print(f'epoch {epoch} : batch {batch_num} : {loss.item():.4f}')
