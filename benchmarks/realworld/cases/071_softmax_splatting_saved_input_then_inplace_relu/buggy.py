# Reproduction of https://github.com/sniklaus/softmax-splatting/issues/50 (softsplat_func saves its input with
# self.save_for_backward(tenIn, tenFlow); the CUDA kernels are replaced by nearest-neighbour splatting in torch).
import torch
import torch.nn as nn

torch.manual_seed(0)


def splat_index(tenFlow, N, C, H, W):
    gy, gx = torch.meshgrid(torch.arange(H), torch.arange(W), indexing='ij')
    tx = (gx + tenFlow[:, 0].round().long()).clamp(0, W - 1)
    ty = (gy + tenFlow[:, 1].round().long()).clamp(0, H - 1)
    return (ty * W + tx).view(N, 1, H * W).expand(N, C, H * W)


class softsplat_func(torch.autograd.Function):
    @staticmethod
    def forward(self, tenIn, tenFlow):
        N, C, H, W = tenIn.shape
        index = splat_index(tenFlow, N, C, H, W)
        tenOut = tenIn.new_zeros(N, C, H * W).scatter_add_(2, index, tenIn.reshape(N, C, H * W))
        self.save_for_backward(tenIn, tenFlow)
        return tenOut.view(N, C, H, W)

    @staticmethod
    def backward(self, tenOutgrad):
        tenIn, tenFlow = self.saved_tensors
        N, C, H, W = tenIn.shape
        index = splat_index(tenFlow, N, C, H, W)
        tenIngrad = tenOutgrad.reshape(N, C, H * W).gather(2, index).view(N, C, H, W)
        return tenIngrad, None


class Synthesis(nn.Module):
    def __init__(self):
        super().__init__()
        self.feat = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.out = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, tenOne, tenFlow):
        tenFeat = self.feat(tenOne)
        tenWarp = softsplat_func.apply(tenFeat, tenFlow)
        tenFeat = self.relu(tenFeat)
        return self.out(torch.cat([tenWarp, tenFeat], 1))


net = Synthesis()
optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
tenOne, tenFlow, tenTwo = torch.randn(2, 3, 8, 8), torch.randn(2, 2, 8, 8) * 2, torch.randn(2, 3, 8, 8)
loss = (net(tenOne, tenFlow) - tenTwo).abs().mean()
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
