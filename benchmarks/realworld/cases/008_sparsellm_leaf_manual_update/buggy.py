# Reproduction of https://github.com/BaiTheBest/SparseLLM/issues/13 (manual gradient step on the auxiliary variable s).
import torch

torch.manual_seed(0)
s = torch.randn(8, 12, dtype=torch.float16)
w = torch.randn(12, 8)
target = torch.randn(8, 8)
s_learning_rate = 0.01
for chunk in (slice(0, 6), slice(6, 12)):
    s_batch = s[:, chunk].float().requires_grad_()
    loss_s = ((s_batch @ w[chunk]) - target).pow(2).mean()
    loss_s.backward()
    s_batch -= s_learning_rate * s_batch.grad
    s_batch.grad.zero_()
    s[:,chunk] = s_batch.detach().to(dtype=torch.float16)
print(s.float().abs().mean())
