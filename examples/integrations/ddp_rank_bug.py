# torchrun --nproc-per-node 2 -m gradguard run examples/integrations/ddp_rank_bug.py
# DDP on CPU (gloo). Only rank 1 has the bug: it applies ReLU in place to a tensor that sigmoid saved for
# backward. Rank 1 raises in backward; rank 0, waiting in DDP's gradient all-reduce, must stop promptly.
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.sigmoid(self.fc1(x))
        if rank == 1:
            h.relu_()  # the bug: sigmoid's backward needs its output unchanged
        return self.fc2(h)


model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    loss = model(torch.randn(16, 4)).pow(2).mean()
    loss.backward()
    opt.step()
print(f"rank {rank} done")
dist.destroy_process_group()
