"""Correct programs: no finding, and gradients bit-identical with the guard on (every mode)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import gradguard


def _snapshot(*modules):
    out = []
    for m in modules:
        for p in m.parameters():
            out.append(p.detach().clone())
            out.append(None if p.grad is None else p.grad.detach().clone())
    return out


def mlp():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
        opt.step()
    return _snapshot(model)


def cnn():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                          nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.SiLU(), nn.Dropout(0.2), nn.Flatten(),
                          nn.Linear(8 * 2 * 2, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.randint(0, 5, (4,))).backward()
        opt.step()
    return _snapshot(model)


def transformer():
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.1, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(2, 5, 16)).pow(2).mean().backward()
        opt.step()
    return _snapshot(model)


def lstm():
    model = nn.LSTM(4, 8, num_layers=2, batch_first=True)
    head = nn.Linear(8, 1)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=1e-2, fused=True)  # fused is fine when steps follow every backward
    h = None
    for _ in range(3):
        opt.zero_grad()
        out, h = model(torch.randn(2, 6, 4), h)
        h = tuple(s.detach() for s in h)  # truncated BPTT done right
        F.mse_loss(head(out[:, -1]), torch.randn(2, 1)).backward()
        opt.step()
    return _snapshot(model, head)


def gan():
    g = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 8))
    d = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-3)
    for _ in range(3):
        real = torch.randn(8, 8)
        fake = g(torch.randn(8, 4))
        opt_d.zero_grad()
        loss_d = (F.binary_cross_entropy_with_logits(d(real), torch.ones(8, 1))
                  + F.binary_cross_entropy_with_logits(d(fake.detach()), torch.zeros(8, 1)))
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        F.binary_cross_entropy_with_logits(d(fake), torch.ones(8, 1)).backward()  # fresh forward through d
        opt_g.step()
    return _snapshot(g, d)


def checkpointed():
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Sigmoid()) for _ in range(3))
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    for reentrant in (False, True):
        opt.zero_grad()
        x = torch.randn(4, 8, requires_grad=True)
        for b in blocks:
            x = checkpoint(b, x, use_reentrant=reentrant)
        x.exp().sum().backward()
        opt.step()
    return _snapshot(blocks)


def bf16_autocast():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.LayerNorm(16), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().softmax(-1)[:, 0].sum()
        loss.backward()
        opt.step()
    return _snapshot(model)


class OutOfPlaceSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def custom_function_retained():
    w = nn.Linear(6, 6)
    x = torch.randn(3, 6)
    y = OutOfPlaceSquare.apply(w(x).sigmoid()).sum()
    y.backward(retain_graph=True)
    y.backward()  # the same graph twice: gradients accumulate, nothing was overwritten
    return _snapshot(w)


class OffloadToCopy(torch.autograd.graph.saved_tensors_hooks):
    """Activation offloading as users write it (a copy out at pack, back at unpack; CPU stands in for host)."""

    def __init__(self):
        super().__init__(lambda t: (t.device, t.detach().clone()), lambda packed: packed[1].to(packed[0]))


def offloading_hooks():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        with OffloadToCopy():
            loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
    return _snapshot(model)


def ema():
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2))
    shadow = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2))
    shadow.load_state_dict(model.state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 6)).pow(2).mean().backward()
        opt.step()
        with torch.no_grad():  # the EMA update after the step: nothing saved needs the old values
            for s, p in zip(shadow.parameters(), model.parameters()):
                s.mul_(0.9).add_(p, alpha=0.1)
    return _snapshot(model, shadow)


def weight_norm_done_right():
    from torch.nn.utils.parametrizations import weight_norm

    model = nn.Sequential(weight_norm(nn.Linear(6, 6)), nn.ReLU(), nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 6)).pow(2).mean().backward()
        opt.step()
    return _snapshot(model)


def maml_done_right():
    model = nn.Linear(4, 1)
    meta = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        meta.zero_grad()
        x, y = torch.randn(6, 4), torch.randn(6, 1)
        params = list(model.parameters())
        inner = F.mse_loss(F.linear(x, *params), y)
        grads = torch.autograd.grad(inner, params, create_graph=True)
        fast = [p - 0.1 * g for p, g in zip(params, grads)]  # functional inner step: the meta-gradient sees it
        F.mse_loss(F.linear(x, *fast), y).backward()
        meta.step()
    return _snapshot(model)


def eval_batchnorm_used_correctly():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for training in (True, False, True):  # each forward's backward runs before the next forward
        model.train(training)
        opt.zero_grad()
        model(torch.randn(6, 4)).pow(2).mean().backward()
        opt.step()
    return _snapshot(model)


class SwishSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.scale = 1.0  # non-tensor attributes are fine
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * (s * (1 + x * (1 - s))) * ctx.scale


class ScaleDirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        ctx.mark_dirty(x)
        return x.mul_(scale)

    @staticmethod
    def backward(ctx, g):
        g.mul_(ctx.scale)  # its own, unshared gradient: allowed
        return g, None


class MaskOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mask = x > 0  # a tensor kept on ctx and never written: no finding
        return x * ctx.mask

    @staticmethod
    def backward(ctx, g):
        return g * ctx.mask


def custom_functions_done_right():
    model = nn.Linear(6, 6)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        h = model(torch.randn(3, 6))
        h = h + SwishSaved.apply(h)
        h = ScaleDirty.apply(h * 1, 0.5)
        h = MaskOnCtx.apply(h) + h
        h.pow(2).sum().backward()
        opt.step()
    return _snapshot(model)


def hooks_returning_new_gradients():
    stem, branch = nn.Linear(6, 6), nn.Linear(6, 6)
    params = list(stem.parameters()) + list(branch.parameters())
    for p in params:
        p.register_hook(lambda g: g.clamp(-1, 1))
    opt = torch.optim.SGD(params, lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        h = stem(torch.randn(4, 6))
        update = branch(h)
        update.register_hook(lambda g: g * 0.5)
        ((h + update) * 3).sum().backward()
        opt.step()
    return _snapshot(stem, branch)


class _BasicBlock(nn.Module):
    """torchvision's BasicBlock: every ReLU(inplace=True) rebinds the name it is given."""

    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        out = self.relu(out)
        return out


def resnet_inplace_relu_blocks():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), _BasicBlock(4), _BasicBlock(4),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(2, 3, 8, 8)), torch.tensor([0, 1])).backward()
        opt.step()
    return _snapshot(model)


class _ActNorm(nn.Module):
    """Glow's data-dependent initialisation through .data on the first batch."""

    def __init__(self, c):
        super().__init__()
        self.loc, self.logs = nn.Parameter(torch.zeros(1, c)), nn.Parameter(torch.zeros(1, c))
        self.initialized = False

    def forward(self, x):
        if not self.initialized:
            with torch.no_grad():
                self.loc.data.copy_(-x.mean(0, keepdim=True))
                self.logs.data.copy_(-torch.log(x.std(0, keepdim=True) + 1e-6))
            self.initialized = True
        return (x + self.loc) * self.logs.exp()


def actnorm_data_init():
    model = nn.Sequential(nn.Linear(4, 6), _ActNorm(6), nn.Tanh(), nn.Linear(6, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()
    return _snapshot(model)


def hessian_vector_then_step():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    params = list(model.parameters())
    for _ in range(2):  # a create_graph gradient used (Hessian-vector product), then an in-place step
        loss = model(torch.randn(6, 4)).square().mean()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        hv = torch.autograd.grad(grads, params, [torch.ones_like(p) for p in params])
        for p, g, h in zip(params, grads, hv):
            p.grad = g.detach() + 0.01 * h
        opt.step()
    return _snapshot(model)


ZOO = [mlp, cnn, transformer, lstm, gan, checkpointed, bf16_autocast, custom_function_retained, offloading_hooks, ema,
       weight_norm_done_right, maml_done_right, eval_batchnorm_used_correctly, custom_functions_done_right,
       hooks_returning_new_gradients, resnet_inplace_relu_blocks, actnorm_data_init, hessian_vector_then_step]
MODES = [dict(fingerprint="full"), dict(fingerprint="sample"), dict(fingerprint="off"),
         dict(fingerprint="sample", track_writes=False)]  # the last: the sentinel of `gradguard run`


@pytest.mark.parametrize("program", ZOO, ids=[p.__name__ for p in ZOO])
def test_correct_program_no_findings_and_bit_identical_gradients(program):
    torch.manual_seed(1234)
    plain = program()
    for mode in MODES:
        torch.manual_seed(1234)
        with gradguard.guard(**mode) as g:
            guarded = program()
        assert g.findings == [], (mode, [str(f) for f in g.findings])
        assert len(plain) == len(guarded)
        for a, b in zip(plain, guarded):
            assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b)), mode


@pytest.mark.parametrize("program", [cnn, lstm, gan, checkpointed], ids=["cnn", "lstm", "gan", "checkpointed"])
def test_bisect_mode_has_no_false_findings_either(program):
    from gradguard.backends.torch.bisect import bisect

    torch.manual_seed(1234)
    plain = program()
    torch.manual_seed(1234)
    out = []
    assert bisect(lambda: out.append(program())) == []
    for a, b in zip(plain, out[0]):
        assert (a is None and b is None) or torch.equal(a, b)
