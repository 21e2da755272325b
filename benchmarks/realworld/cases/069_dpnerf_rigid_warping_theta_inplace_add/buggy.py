# Reproduction of https://github.com/dogyoonlee/DP-NeRF/issues/2 (rigid_warping.py: the so(3) exponential map of
# the rigid blurring kernel, where theta is the rotation angle; the reporter found `theta += 1.0e-10`).
import torch
import torch.nn as nn

torch.manual_seed(0)


def skew(w):
    zeros = torch.zeros_like(w[..., 0])
    return torch.stack([torch.stack([zeros, -w[..., 2], w[..., 1]], -1),
                        torch.stack([w[..., 2], zeros, -w[..., 0]], -1),
                        torch.stack([-w[..., 1], w[..., 0], zeros], -1)], -2)


def exp_so3(w):
    theta = torch.linalg.norm(w, dim=-1)
    theta += 1.0e-10
    W = skew(w / theta[..., None])
    theta = theta[..., None, None]
    eye = torch.eye(3).expand_as(W)
    return eye + torch.sin(theta) * W + (1 - torch.cos(theta)) * (W @ W)


class RigidBlurringModel(nn.Module):
    def __init__(self, num_img, num_pt=3):
        super().__init__()
        self.rot = nn.Embedding(num_img, 3 * num_pt)
        nn.init.normal_(self.rot.weight, std=1e-2)
        self.num_pt = num_pt

    def forward(self, rays_o, img_idx):
        w = self.rot(img_idx).reshape(-1, self.num_pt, 3)
        R = exp_so3(w)
        return torch.einsum('bkij,bj->bki', R, rays_o)


model = RigidBlurringModel(num_img=4)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
rays_o, img_idx = torch.randn(8, 3), torch.randint(0, 4, (8,))
target = torch.randn(8, 3, 3)
loss = ((model(rays_o, img_idx) - target) ** 2).mean()
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
