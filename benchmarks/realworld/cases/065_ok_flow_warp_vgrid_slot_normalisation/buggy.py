# Correct program under current PyTorch: the warp of https://github.com/aimerykong/predictive-filter-flow/issues/5
# (losses.py). The slot writes read vgrid and write vgrid, but only scalar ops touch it before grid_sample, and they save
# nothing; the maintainer could not reproduce the error reported with torch 1.0.1.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


def warp(x, flo):
    B, C, H, W = x.size()
    xx = torch.arange(0, W).view(1, -1).repeat(H, 1)
    yy = torch.arange(0, H).view(-1, 1).repeat(1, W)
    xx = xx.view(1, 1, H, W).repeat(B, 1, 1, 1)
    yy = yy.view(1, 1, H, W).repeat(B, 1, 1, 1)
    grid = torch.cat((xx, yy), 1).float()
    vgrid = grid + flo
    vgrid[:,0,:,:] = 2.0*vgrid[:,0,:,:]/max(W-1,1)-1.0
    vgrid[:,1,:,:] = 2.0*vgrid[:,1,:,:]/max(H-1,1)-1.0
    vgrid = vgrid.permute(0, 2, 3, 1)
    return F.grid_sample(x, vgrid, align_corners=True)


flow_net = nn.Conv2d(6, 2, 3, padding=1)
im1, im2 = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
flo = flow_net(torch.cat([im1, im2], 1))
loss = (warp(im2, flo) - im1).abs().mean()
loss.backward()
print(loss.item())
