# Reproduction of https://discuss.pytorch.org/t/backpropagation-graph-is-reused-while-it-shouldnt/24554 (the
# poster's snippet: y = t @ a is computed once before the loop and reused in every iteration's loss; the second
# loss.backward() runs into the part of the graph the first one freed).
import torch

measure = torch.nn.MSELoss()

x = torch.tensor([1, 0], dtype=torch.float64)
t = torch.eye(2, dtype=torch.float64, requires_grad=True)
a = torch.ones(2, dtype=torch.float64, requires_grad=True)
y = t @ a

for __ in range(2):
    x_out = t @ (x + y)  # Raises `RuntimeError` later on.
    # x_out = t @ (x + t @ a)  # Works fine.
    loss = measure(x_out, x)
    loss.backward()

print(t.grad, a.grad)
