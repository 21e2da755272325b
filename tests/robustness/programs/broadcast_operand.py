# A 4 MiB tensor expanded to 1 GiB and saved for backward: the fingerprint materialised it (1 GB more peak memory,
# 10-15x slower step).
import resource

import torch

torch.manual_seed(0)
w = torch.randn(1024, 1024, requires_grad=True)
x = torch.randn(1024, 1024)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
loss = (x[None].expand(64, 1024, 1024) * w).sum()
loss.backward()
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print("grad", round(w.grad.double().sum().item(), 3))
print("peak growth under 600 MiB", grown < 600)
