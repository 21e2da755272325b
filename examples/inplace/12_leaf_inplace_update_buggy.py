# Hand-written gradient descent that updates the weight in place with grad mode on.
import torch

torch.manual_seed(0)
w = torch.randn(3, requires_grad=True)
x = torch.randn(10, 3)
y = x @ torch.tensor([1.0, -2.0, 0.5])
for step in range(3):
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    w -= 0.1 * w.grad
    w.grad.zero_()
    print(f"step {step}: loss={loss.item():.4f}")
