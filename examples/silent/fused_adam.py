"""Adam(fused=True) on CPU updates parameters without bumping their version: the RNN blog-post bug
(seed 000) becomes silently wrong instead of an error.

    python examples/silent/fused_adam.py
"""

import torch

import gradguard

torch.manual_seed(0)
rnn = torch.nn.RNN(input_size=1, hidden_size=1, num_layers=1)
xs = torch.tensor([[[1.0]], [[2.0]], [[3.0]], [[4.0]], [[5.0]]])
ys = 2 * xs
loss_fn = torch.nn.MSELoss()
opt = torch.optim.Adam(rnn.parameters(), lr=0.01, fused=True)

try:
    with gradguard.guard():
        h = torch.zeros(1, 1)
        for i in range(5):
            opt.zero_grad()
            out, h_next = rnn(xs[i], h)
            loss = loss_fn(out, ys[i])
            loss.backward(retain_graph=True)
            opt.step()
            h = h_next  # the real fix: h = h_next.detach() (and no retain_graph)
except gradguard.SilentModificationError as error:
    print(f"iteration {i}:")
    print(error)
