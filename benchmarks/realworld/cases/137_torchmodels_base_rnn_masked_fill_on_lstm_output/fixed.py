# Reproduction of https://github.com/kaniblu/pytorch-models/pull/8 (torchmodels.modules.rnn.BaseRNN.forward before
# that pull request: after running the LSTM it zeroes the padded steps with o.masked_fill_(...), an in-place write into
# the LSTM's output, which the RNN kernel saved for its backward; the pull request removes the line. The library's own
# test model (tests/test_module.py _test_rnn, trained as in ModuleTester.test_backward), shrunk; `1 - mask` written
# `~mask`, since current PyTorch masks are bool; CPU).
import torch
import torch.nn as nn
import torch.nn.functional as tfunc
import torch.nn.utils.rnn as tr

torch.manual_seed(0)


class utils:  # torchmodels.utils
    @staticmethod
    def mask(lens, max_len=None):
        if max_len is None:
            max_len = lens.max().item()
        enum = torch.arange(max_len).long().to(lens)
        return lens.unsqueeze(1) > enum.unsqueeze(0)


class AbstractRNN(nn.Module):
    def __init__(self, input_dim, hidden_dim):
        super(AbstractRNN, self).__init__()
        self.input_dim = input_dim
        self.hidden_dim = hidden_dim

    def forward(self, x, lens=None, h=None):
        raise NotImplementedError()


class BaseRNN(AbstractRNN):

    def __init__(self, *args, dynamic=False, layers=1, dropout=0, **kwargs):
        super(BaseRNN, self).__init__(*args, **kwargs)
        self.dynamic = dynamic
        self.layers = layers
        self.dropout = dropout

    def forward_cell(self, x, h0):
        raise NotImplementedError()

    def forward(self, x, lens=None, h=None):
        batch_size, max_len, _ = x.size()
        mask = None
        if lens is not None:
            mask = utils.mask(lens, max_len)
            x = x.masked_fill(~mask.unsqueeze(-1), 0)
        if self.dynamic:
            x = tr.pack_padded_sequence(x, lens, True)
        o, c, h = self.forward_cell(x, h)
        if self.dynamic:
            o, _ = tr.pad_packed_sequence(o, True, 0, max_len)
            o = o.contiguous()
        return o, c, h


class LSTM(BaseRNN):
    name = "lstm"

    def __init__(self, *args, **kwargs):
        super(LSTM, self).__init__(*args, **kwargs)
        self.lstm = nn.LSTM(**self._lstm_kwargs())

    def _lstm_kwargs(self):
        return dict(
            input_size=self.input_dim,
            hidden_size=self.hidden_dim,
            num_layers=self.layers,
            bidirectional=False,
            dropout=self.dropout,
            batch_first=True
        )

    def forward_cell(self, x, h0):
        o, (h, c) = self.lstm(x, h0)
        h = h.permute(1, 0, 2).contiguous()
        c = c.permute(1, 0, 2).contiguous()
        return o, c[:, -1], h[:, -1]


class Model(nn.Module):
    max_len = 8

    def __init__(self, in_dim, out_dim, hidden_dim=16):
        super(Model, self).__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.hidden_dim = hidden_dim

        self.in_linear = nn.Linear(self.in_dim, self.max_len * hidden_dim)
        self.rnn = LSTM(self.hidden_dim, self.hidden_dim)
        self.out_linear = nn.Linear(
            in_features=(self.max_len + 1) * self.hidden_dim,
            out_features=self.out_dim
        )

    def forward(self, x):
        batch_size, max_len = x.size(0), self.max_len
        x = self.in_linear(x).view(batch_size, max_len, -1)
        lens = torch.randint(1, max_len + 1, (batch_size,)).long()
        lens = lens.to(x)
        mask = utils.mask(lens, max_len)
        x = x.masked_fill(~mask.unsqueeze(-1), float("nan"))
        o, _, h = self.rnn(x, lens)
        x = torch.cat([o.contiguous().view(batch_size, -1), h], 1)
        return self.out_linear(x)


input_dim, batch_size = 16, 8
model = Model(input_dim, 2)
op = torch.optim.Adam(model.parameters())
for _ in range(3):
    op.zero_grad()
    data = torch.randint(0, 2, (batch_size, input_dim))
    data = data.float()
    loss = tfunc.cross_entropy(model(data), data[:, 0].long())
    loss.backward()
    loss = loss.item()
    op.step()
print(f"loss={loss:.3f}")
