# Reproduction of https://github.com/fangwei123456/Spike-Element-Wise-ResNet/issues/19 (spikingjelly's
# MultiStepIFNode with its fused kernel: the CuPy kernel becomes a torch loop in an autograd Function that saves
# h_seq and spike_seq, as neuron_kernel.MultiStepIFNodePTT does; a SEW block of two neurons).
import torch
import torch.nn as nn

torch.manual_seed(0)


class MultiStepIFNodePTT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_seq, v_init, v_threshold, v_reset):
        v = v_init
        h_seq, spike_seq, v_seq = [], [], []
        for x in x_seq:
            h = v + x
            spike = (h >= v_threshold).to(x)
            v = h * (1. - spike) + v_reset * spike
            h_seq.append(h), spike_seq.append(spike), v_seq.append(v)
        h_seq, spike_seq = torch.stack(h_seq), torch.stack(spike_seq)
        ctx.save_for_backward(h_seq, spike_seq)
        ctx.v_threshold = v_threshold
        return spike_seq, torch.stack(v_seq)

    @staticmethod
    def backward(ctx, grad_spike_seq, grad_v_seq):
        h_seq, spike_seq = ctx.saved_tensors
        sg = torch.sigmoid(4. * (h_seq - ctx.v_threshold))
        grad_sg = 4. * sg * (1. - sg)
        grad_x_seq = torch.empty_like(h_seq)
        grad_v = torch.zeros_like(h_seq[0])
        for t in range(h_seq.shape[0] - 1, -1, -1):
            grad_h = grad_spike_seq[t] * grad_sg[t] + (grad_v + grad_v_seq[t]) * (1. - spike_seq[t])
            grad_x_seq[t] = grad_h
            grad_v = grad_h
        return grad_x_seq, grad_v, None, None


class MultiStepIFNode(nn.Module):
    def __init__(self, v_threshold=1., v_reset=0.):
        super().__init__()
        self.v_threshold, self.v_reset = v_threshold, v_reset
        self.v = torch.zeros(1)

    def forward(self, x_seq):
        v_init = self.v.expand_as(x_seq[0]) if self.v.shape != x_seq[0].shape else self.v
        spike_seq, v_seq = MultiStepIFNodePTT.apply(x_seq, v_init, self.v_threshold, self.v_reset)
        self.v = v_seq[-1]
        return spike_seq


class SEWBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))
        self.sn1 = MultiStepIFNode()
        self.conv2 = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))
        self.sn2 = MultiStepIFNode()

    def forward(self, x_seq):
        T, N = x_seq.shape[:2]
        out = self.sn1(self.conv1(x_seq.flatten(0, 1)).view(x_seq.shape))
        out = self.sn2(self.conv2(out.flatten(0, 1)).view(x_seq.shape))
        return out + x_seq


net = nn.ModuleDict({"stem": nn.Conv2d(1, 4, 3, padding=1), "block": SEWBlock(4), "fc": nn.Linear(4, 3)})
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
T = 4
for iteration in range(2):
    img, label = torch.rand(2, 1, 8, 8), torch.tensor([0, 2])
    x_seq = net["stem"](img).unsqueeze(0).repeat(T, 1, 1, 1, 1)
    out = net["block"](x_seq).mean(dim=(0, 3, 4))
    loss = nn.functional.cross_entropy(net["fc"](out), label)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for m in net.modules():
        if isinstance(m, MultiStepIFNode):
            m.v = torch.zeros(1)
print(loss.item())
