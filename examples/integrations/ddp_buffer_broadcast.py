# torchrun --nproc-per-node 2 -m gradguard run examples/integrations/ddp_buffer_broadcast.py
# DDP's buffer broadcast overwrites, in place, a buffer that an earlier forward saved for backward.
# Two forward passes before one backward (two micro-batches, GAN real/fake, two views ...). Between them,
# rank 0 alone updates a buffer. The second forward starts with DDP broadcasting rank 0's buffers into every
# rank's buffers in place (broadcast_buffers=True, the default), so on rank 1 the buffer that the first
# forward saved changes under autograd's feet. torch >= 2.13 preserves the version counter during that
# broadcast: plain PyTorch computes rank 1's gradient silently wrong (older versions raise "modified by an
# inplace operation"). Rank 0's own write is a plain in-place bug and is reported as such.
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return self.lin(x) * self.scale


model = DDP(Scaled())
x1, x2 = torch.randn(8, 4), torch.randn(8, 4)
loss = model(x1).pow(2).mean()
if rank == 0:
    with torch.no_grad():
        model.module.scale.mul_(0.5)  # rank 0 anneals the scale
loss = loss + model(x2).pow(2).mean()  # DDP's forward copies rank 0's buffers into every rank's
loss.backward()
print(f"rank {rank} done")
dist.destroy_process_group()
