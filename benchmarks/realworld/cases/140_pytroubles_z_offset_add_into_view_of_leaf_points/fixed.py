# Reproduction of https://pytroubles.com/en/ampposts/id3016-pytorch-z-channel-shift-without-breaking-autograd-avoid-in-place-views-keep-gradients-safe
# (a write-up of a Stack Overflow question: add a per-batch z-offset to the z channel of a (B, 3, N) point tensor with
# `pts[:, 2, :] += z_offset`; pts is a leaf that requires grad, so the in-place add on its view raises "a view of a
# leaf Variable that requires grad is being used in an in-place operation"; the fix builds a new tensor out of place
# by stacking the untouched x and y channels with the shifted z channel. A loss and backward added after the shift).
import torch

torch.manual_seed(0)

# 2 batches, 3 channels (x, y, z), 5 points
pts = torch.rand(2, 3, 5, requires_grad=True)
# one z shift per batch
z_offset = torch.tensor([[1.0], [10.0]], requires_grad=True)
# out-of-place: stack the untouched x, y channels with the shifted z channel
pts_shifted = torch.stack([pts[:, 0, :], pts[:, 1, :], pts[:, 2, :] + z_offset], dim=1)

loss = pts_shifted.pow(2).sum()
loss.backward()
print(z_offset.grad)
