"""The benchmark model zoo: seven training steps that span gradguard's cost regimes.

Every workload is one full training step (zero_grad, forward, backward, ``Adam.step()``) on fixed data, so
the hooks, the fingerprint and the write log all see the optimizer's in-place writes, exactly as in real
training. Sizes are chosen so that, on one CPU thread, plain steps take roughly:

=================  ===========  ===========================================================================
name               plain step   regime
=================  ===========  ===========================================================================
``tiny_mlp``       ~1 ms        fixed per-op / per-saved-tensor cost dominates (worst case for hooks)
``lstmcell_loop``  ~20 ms       Python loop of 50 ``nn.LSTMCell`` calls: ~700 saved tensors per step
``lstm``           ~50-150 ms   fused ``nn.LSTM`` kernel: few, large saved tensors
``cnn``            ~50-100 ms   conv + BatchNorm (running stats are written in place, undeclared)
``transformer``    ~100-300 ms  ``nn.TransformerEncoder``: many medium tensors
``transformer_mid`` ~10 ms      2 layers, d=128, batch 8x64: ~115 saved tensors, Python dispatch is a large share
``gan``            ~10-20 ms    two models, two optimizers, D step then G step (the correct order)
=================  ===========  ===========================================================================

``build(name, seed=0, device="cpu", wrap=None)`` returns a :class:`Workload`; ``workload.step()`` runs one step.
Building the same name with the same seed twice gives bit-identical steps (seed the global RNG before each
step when the model has dropout: ``workload.step(seed=...)`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Workload", "MODELS", "build", "DESCRIPTIONS"]


@dataclass
class Workload:
    name: str
    description: str
    modules: dict[str, nn.Module]
    optimizers: list[torch.optim.Optimizer]
    _step: Callable[[], torch.Tensor]
    device: str = "cpu"
    extra: dict = field(default_factory=dict)

    def step(self, seed: int | None = None) -> float | None:
        """One training step; returns nothing on the hot path (no host sync)."""
        if seed is not None:
            torch.manual_seed(seed)
        self._step()

    def parameters(self) -> list[tuple[str, torch.Tensor]]:
        out = []
        for prefix, module in self.modules.items():
            out.extend((f"{prefix}.{n}", p) for n, p in module.named_parameters())
        return out

    def state(self) -> dict[str, torch.Tensor]:
        """Parameters, their gradients and buffers, detached copies (for bit-identity comparisons)."""
        out = {}
        for prefix, module in self.modules.items():
            for n, p in module.named_parameters():
                out[f"{prefix}.{n}"] = p.detach().clone()
                out[f"{prefix}.{n}.grad"] = None if p.grad is None else p.grad.detach().clone()
            for n, b in module.named_buffers():
                out[f"{prefix}.{n}[buffer]"] = b.detach().clone()
        return out

    def static_bytes(self) -> int:
        """Bytes held between steps: parameters, gradients, buffers, optimizer state, fixed inputs."""
        seen: set[int] = set()
        total = 0

        def add(t):
            nonlocal total
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                if s.data_ptr() not in seen:
                    seen.add(s.data_ptr())
                    total += s.nbytes()

        for module in self.modules.values():
            for p in module.parameters():
                add(p)
                add(p.grad)
            for b in module.buffers():
                add(b)
        for opt in self.optimizers:
            for st in opt.state.values():
                for v in st.values():
                    add(v)
        for v in self.extra.values():
            add(v)
        return total


def _tiny_mlp(device: str, wrap: Callable) -> Workload:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fwd = wrap(model)
    x = torch.randn(32, 64, device=device)
    y = torch.randint(0, 10, (32,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    return Workload("tiny_mlp", DESCRIPTIONS["tiny_mlp"], {"model": model}, [opt], step, device, {"x": x, "y": y})


class _CellLoop(nn.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int):
        super().__init__()
        self.cell = nn.LSTMCell(n_in, hidden)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, xs):  # xs: (T, B, n_in)
        h = xs.new_zeros(xs.shape[1], self.cell.hidden_size)
        c = torch.zeros_like(h)
        outs = []
        for x in xs:
            h, c = self.cell(x, (h, c))
            outs.append(h)
        return self.head(torch.stack(outs))


def _lstmcell_loop(device: str, wrap: Callable) -> Workload:
    model = _CellLoop(32, 128, 8).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fwd = wrap(model)
    xs = torch.randn(50, 16, 32, device=device)
    target = torch.randn(50, 16, 8, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(fwd(xs), target)
        loss.backward()
        opt.step()
        return loss

    return Workload("lstmcell_loop", DESCRIPTIONS["lstmcell_loop"], {"model": model}, [opt], step, device,
                    {"x": xs, "y": target})


class _SeqLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(128, 256, num_layers=2)
        self.head = nn.Linear(256, 16)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out)


def _lstm(device: str, wrap: Callable) -> Workload:
    model = _SeqLSTM().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fwd = wrap(model)
    x = torch.randn(32, 32, 128, device=device)  # (seq, batch, features)
    target = torch.randn(32, 32, 16, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(fwd(x), target)
        loss.backward()
        opt.step()
        return loss

    return Workload("lstm", DESCRIPTIONS["lstm"], {"model": model}, [opt], step, device, {"x": x, "y": target})


def _cnn(device: str, wrap: Callable) -> Workload:
    def block(cin, cout, stride):
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(
        *block(3, 32, 1), *block(32, 64, 2), *block(64, 64, 1), *block(64, 128, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fwd = wrap(model)
    x = torch.randn(32, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (32,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    return Workload("cnn", DESCRIPTIONS["cnn"], {"model": model}, [opt], step, device, {"x": x, "y": y})


class _Encoder(nn.Module):
    def __init__(self, d_model: int, nhead: int, ff: int, layers: int):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=d_model, nhead=nhead, dim_feedforward=ff, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 16)

    def forward(self, x):
        return self.head(self.encoder(x))


def _encoder_workload(name: str, device: str, wrap: Callable, *, d_model: int, nhead: int, ff: int, layers: int,
                      batch: int, seq: int) -> Workload:
    model = _Encoder(d_model, nhead, ff, layers).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    fwd = wrap(model)
    x = torch.randn(batch, seq, d_model, device=device)
    target = torch.randn(batch, seq, 16, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(fwd(x), target)
        loss.backward()
        opt.step()
        return loss

    return Workload(name, DESCRIPTIONS[name], {"model": model}, [opt], step, device, {"x": x, "y": target})


def _transformer(device: str, wrap: Callable) -> Workload:
    return _encoder_workload("transformer", device, wrap, d_model=256, nhead=8, ff=1024, layers=4, batch=4, seq=128)


def _transformer_mid(device: str, wrap: Callable) -> Workload:
    """Issue 17's mid-size transformer: a step whose CPU time is mostly per-op work, as on a GPU."""
    return _encoder_workload("transformer_mid", device, wrap, d_model=128, nhead=4, ff=512, layers=2, batch=8,
                             seq=64)


def _gan(device: str, wrap: Callable) -> Workload:
    z_dim, data_dim = 64, 784
    G = nn.Sequential(nn.Linear(z_dim, 256), nn.ReLU(), nn.Linear(256, 512), nn.ReLU(),
                      nn.Linear(512, data_dim), nn.Tanh()).to(device)
    D = nn.Sequential(nn.Linear(data_dim, 512), nn.LeakyReLU(0.2), nn.Linear(512, 256), nn.LeakyReLU(0.2),
                      nn.Linear(256, 1)).to(device)
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    g, d = wrap(G), wrap(D)
    real = torch.rand(128, data_dim, device=device) * 2 - 1
    z = torch.randn(128, z_dim, device=device)
    ones = torch.ones(128, 1, device=device)
    zeros = torch.zeros(128, 1, device=device)

    def step():
        # D step: the fake batch is detached, so D's backward never reaches G's graph.
        fake = g(z)
        opt_d.zero_grad(set_to_none=True)
        loss_d = (F.binary_cross_entropy_with_logits(d(real), ones)
                  + F.binary_cross_entropy_with_logits(d(fake.detach()), zeros))
        loss_d.backward()
        opt_d.step()
        # G step: a fresh D forward *after* D's update, so no saved D weight is stale (the correct order).
        opt_g.zero_grad(set_to_none=True)
        loss_g = F.binary_cross_entropy_with_logits(d(fake), ones)
        loss_g.backward()
        opt_g.step()
        return loss_g

    return Workload("gan", DESCRIPTIONS["gan"], {"G": G, "D": D}, [opt_d, opt_g], step, device,
                    {"real": real, "z": z, "ones": ones, "zeros": zeros})


DESCRIPTIONS = {
    "tiny_mlp": "MLP 64-128-128-10, batch 32",
    "lstmcell_loop": "nn.LSTMCell(32, 128) in a Python loop, 50 steps, batch 16, linear head",
    "lstm": "nn.LSTM(128, 256, 2 layers), seq 32, batch 32, linear head",
    "cnn": "4x (conv3x3 + BatchNorm + ReLU), 32-128 channels, 32x32 images, batch 32",
    "transformer": "nn.TransformerEncoder d=256, 8 heads, ff 1024, 4 layers, seq 128, batch 4, dropout 0.1",
    "gan": "MLP GAN (G 64-256-512-784, D 784-512-256-1), batch 128; D step then G step",
    "transformer_mid": "nn.TransformerEncoder d=128, 4 heads, ff 512, 2 layers, seq 64, batch 8, dropout 0.1",
}

MODELS: dict[str, Callable[[str, Callable], Workload]] = {
    "tiny_mlp": _tiny_mlp,
    "lstmcell_loop": _lstmcell_loop,
    "lstm": _lstm,
    "cnn": _cnn,
    "transformer": _transformer,
    "gan": _gan,
    "transformer_mid": _transformer_mid,
}


def build(name: str, seed: int = 0, device: str = "cpu", wrap: Callable | None = None) -> Workload:
    """A fresh workload; ``wrap`` (e.g. ``torch.compile``) is applied to every module used in the forward."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    torch.manual_seed(seed)
    return MODELS[name](device, wrap or (lambda m: m))
