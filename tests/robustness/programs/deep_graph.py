# A 60k-op unrolled recurrence: freeing the graph segfaulted under the guard (pack read t.grad_fn per tensor).
import torch

torch.manual_seed(0)
h = torch.randn(4, requires_grad=True)
x = h
for step in range(20_000):
    x = torch.tanh(x * 0.999 + 0.001)
loss = x.sum()
loss.backward()
print("grad", h.grad.double().sum().item())
del x, loss
print("freed")
