# Correct program after https://github.com/fangwei123456/spikingjelly/issues/318 (the maintainer recommends calling
# functional.reset_net(model) after optimizer.step(); neurons as in spikingjelly's MultiStepIFNode, kernel in torch).
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
        self.reset()

    def reset(self):
        self.v = torch.zeros(1)

    def forward(self, x_seq):
        v_init = self.v.expand_as(x_seq[0]) if self.v.shape != x_seq[0].shape else self.v
        spike_seq, v_seq = MultiStepIFNodePTT.apply(x_seq, v_init, self.v_threshold, self.v_reset)
        self.v = v_seq[-1]
        return spike_seq


def reset_net(net):
    for m in net.modules():
        if hasattr(m, 'reset'):
            m.reset()


net = nn.Sequential(nn.Flatten(2), nn.Linear(16, 8), MultiStepIFNode(), nn.Linear(8, 3))
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
T = 4
for epoch in range(3):
    x, y = torch.rand(2, 1, 4, 4), torch.tensor([1, 2])
    x_seq = x.unsqueeze(0).repeat(T, 1, 1, 1, 1).flatten(0, 1)
    out = net(x_seq.view(T, 2, 1, 16)).mean(0)
    loss = nn.functional.cross_entropy(out, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    reset_net(net)
print(loss.item())
