# Reproduction of https://github.com/kail8/UnsupDIS-pytorch/issues/26 (the spatial transform of the homography warp,
# line 233). T_g is split into x_s, y_s, t_s; t_s_flat is a view of one of those views.
import torch
import torch.nn as nn

torch.manual_seed(0)


def transform(H_tf, width, height):
    batch_size = H_tf.shape[0]
    x_t, y_t = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
    grid = torch.stack([x_t.reshape(-1), y_t.reshape(-1), torch.ones(height * width)], 0)
    grid = grid.unsqueeze(0).expand(batch_size, -1, -1)
    T_g = torch.matmul(H_tf, grid)
    x_s, y_s, t_s = torch.chunk(T_g, 3, dim=1)
    t_s_flat = torch.reshape(t_s, [-1])
    eps = 1e-7
    small_value = (t_s_flat.detach().abs() < eps).float()
    t_s_flat = t_s_flat * (1-small_value) + small_value * eps
    x_s_flat = torch.reshape(x_s, [-1]) / t_s_flat
    y_s_flat = torch.reshape(y_s, [-1]) / t_s_flat
    return x_s_flat, y_s_flat


regressor = nn.Linear(4, 9)
H = regressor(torch.randn(1, 4)).view(1, 3, 3) + torch.eye(3)
x_s_flat, y_s_flat = transform(H, 4, 4)
loss = x_s_flat.pow(2).mean() + y_s_flat.pow(2).mean()
loss.backward()
print(loss.item())
