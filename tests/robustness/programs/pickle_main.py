# torch.save of a model whose class is defined in the script, a multiprocessing spawn pool running a function
# defined in the script: both need the script to be the real __main__ module.
import io
import multiprocessing as mp

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x).relu()


def square(v):
    return v * v


if __name__ == "__main__":
    torch.manual_seed(0)
    net = Net()
    buffer = io.BytesIO()
    torch.save(net, buffer)
    buffer.seek(0)
    again = torch.load(buffer, weights_only=False)
    net(torch.ones(1, 3)).sum().backward()
    print("reloaded", type(again).__name__, torch.equal(again.fc.weight, net.fc.weight))
    print("grad", net.fc.weight.grad.double().sum().item())
    with mp.get_context("spawn").Pool(2) as pool:
        print("pool", pool.map(square, [1, 2, 3]))
