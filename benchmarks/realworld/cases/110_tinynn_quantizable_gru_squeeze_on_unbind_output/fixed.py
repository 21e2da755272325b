# Reproduction of https://github.com/alibaba/TinyNeuralNetwork/issues/238 (tinynn/graph/quantization/quantizable/gru.py:
# GRU.forward unbinds the initial hidden state per layer and squeezes each piece in place; in a QAT-traced model the
# hidden state comes from a fake-quant node and requires grad, and unbind's outputs may not be modified in place. The
# cell's FloatFunctional adds/muls written as plain ops, the bidirectional branch dropped, sizes shrunk).
from typing import Optional

import torch
from torch import Tensor

torch.manual_seed(0)


class GRUCell(torch.nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.input_size = input_dim
        self.hidden_size = hidden_dim
        self.igates = torch.nn.Linear(input_dim, 3 * hidden_dim, bias=bias)
        self.hgates = torch.nn.Linear(hidden_dim, 3 * hidden_dim, bias=bias)
        self.act1 = torch.nn.Sigmoid()
        self.act2 = torch.nn.Tanh()

    def forward(self, x: Tensor, hidden: Optional[Tensor] = None):
        result = []
        ri, zi, ni = self.igates(x).chunk(3, -1)
        for k in range(x.size(0)):
            hx = hidden
            rh, zh, nh = self.hgates(hx).chunk(3, -1)
            rgate = self.act1(ri[k, ...] + rh)
            zgate = self.act1(zi[k, ...] + zh)
            ngate = self.act2(ni[k, ...] + rgate * nh)
            hidden = (zgate * -1 + 1) * ngate + zgate * hx
            result.append(hidden)
        result_tensor = torch.stack(result, 0)
        return result_tensor, hidden


class _GRULayer(torch.nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.cell = GRUCell(input_dim, hidden_dim, bias=bias)

    def forward(self, x: Tensor, hidden: Optional[Tensor] = None):
        result, h = self.cell(x, hidden)
        return result, h


class GRU(torch.nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, bidirectional: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.bidirectional = bidirectional
        layers = [_GRULayer(self.input_size, self.hidden_size, bias)]
        for layer in range(1, num_layers):
            layers.append(_GRULayer(self.hidden_size, self.hidden_size, bias))
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x: Tensor, hidden: Optional[Tensor] = None):
        if self.batch_first:
            x = x.transpose(0, 1)

        max_batch_size = x.size(1)
        num_directions = 2 if self.bidirectional else 1
        if hidden is None:
            zeros = torch.zeros(num_directions, max_batch_size, self.hidden_size, dtype=torch.float, device=x.device)
            zeros.squeeze_(0)
            hx = [zeros for _ in range(self.num_layers)]
        else:
            hidden_non_opt = torch.jit._unwrap_optional(hidden)
            if isinstance(hidden_non_opt[0], Tensor):
                hx = (
                    hidden_non_opt[0]
                    .reshape(self.num_layers, num_directions, max_batch_size, self.hidden_size)
                    .unbind(0)
                )
                hx = [(hx[idx].squeeze(0)) for idx in range(self.num_layers)]
            else:
                hx = hidden_non_opt

        hx_list = []
        for idx, layer in enumerate(self.layers):
            x, h = layer(x, hx[idx])
            hx_list.append(torch.jit._unwrap_optional(h))
        hx_tensor = torch.stack(hx_list)
        hx_tensor = hx_tensor.reshape(-1, hx_tensor.shape[-2], hx_tensor.shape[-1])

        if self.batch_first:
            x = x.transpose(0, 1)

        return x, hx_tensor


class CRNNKWSCleanModel(torch.nn.Module):  # the traced QAT model of the report, shrunk
    def __init__(self):
        super().__init__()
        self.h0 = torch.nn.Parameter(torch.zeros(1, 1, 2, 8))
        self.kws_predictor_rnn = GRU(4, 8, batch_first=True)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, reshape_0_f):
        fake_quant_2 = torch.fake_quantize_per_tensor_affine(self.h0, 0.05, 0, -128, 127)
        kws_predictor_rnn = self.kws_predictor_rnn(reshape_0_f, fake_quant_2)
        return self.fc(kws_predictor_rnn[0][:, -1])


model = CRNNKWSCleanModel()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
out = model(torch.randn(2, 5, 4))
loss = out.pow(2).mean()
loss.backward()
optimizer.step()
print(loss.item())
