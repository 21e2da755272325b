"""A grid of neighbours for `gradguard fix`: one in-place write on a tensor autograd saved, spelt many ways, made
by different savers, in different places of a program. Each program is repaired with `gradguard fix --apply` and
judged against its reference (the same program with the tensor cloned just before the write): the repaired
script must exit 0 and give the reference's gradients. A repair that runs but changes the gradients (a detach, a
dropped write) counts as wrong.

Not a corpus of real reports: a measure of how far the repair search generalises beyond the shapes it was built
from. Nobody tunes a rule to one cell; a failing cell is a failing mechanism.

    python benchmarks/fixgrid/grid.py --jobs 2 [--only substring] [--src src] [--out DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# (name, the write with X for the written tensor). The reference clones X first: `X = X.clone()` then the write.
WRITES = [
    ("mul_", "X.mul_(2)"),
    ("imul", "X *= 2"),
    ("iadd_tensor", "X += b"),
    ("setitem", "X[:, 0] = 0"),
    ("setitem_mask", "X[mask] = 0.0"),
    ("clamp_", "X.clamp_(min=0.1)"),
    ("torch.relu_", "torch.relu_(X)"),
    ("F.relu_inplace", "F.relu(X, inplace=True)"),
    ("sigmoid_", "X.sigmoid_()"),
    ("tanh_", "X.tanh_()"),
    ("masked_fill_", "X.masked_fill_(mask, 0.0)"),
    ("add_", "X.add_(b)"),
    ("copy_", "X.copy_(b)"),
    ("div_assigned", "X = X.div_(b.abs().sum())"),
    ("exp_value", "g = X.exp_()"),
    ("index_fill_", "X.index_fill_(1, idx, 0.0)"),
    ("addcmul_", "X.addcmul_(b, b, value=0.5)"),
    ("lerp_", "X.lerp_(b, 0.5)"),
    ("pow_", "X.pow_(2)"),
    ("zero_", "X.zero_()"),
    ("fill_", "X.fill_(1.0)"),
    ("scatter_", "X.scatter_(1, col, 0.0)"),
    ("chain", "X.clamp_(0, 1).mul_(2)"),
    ("in_expression", "y = X.sub_(1) * 2"),
]

# (name, the line that makes X, the line that saves it). X = the tensor; a, w leaves that require grad.
SAVERS = [
    ("pow_saves_input", "X = a * 1.5", "s = X.pow(2)"),
    ("matmul_saves_input", "X = a * 1.5", "s = X @ w"),
    ("sigmoid_saves_output", "X = torch.sigmoid(a)", "s = X * 1.0"),
]

# More savers, each with a sample of the write spellings (one of each kind: a method, an augmented assignment, an
# item assignment, an inplace= flag, a copy, a value used, a chain): outputs saved by exp, tanh and softmax, a
# divisor, a linear layer's input, and a view of a temporary saved by pow.
MORE_SAVERS = [
    ("exp_saves_output", "X = torch.exp(a)", "s = X * 1.0"),
    ("tanh_saves_output", "X = torch.tanh(a)", "s = X * 1.0"),
    ("softmax_saves_output", "X = torch.softmax(a, dim=1)", "s = X * 1.0"),
    ("div_saves_divisor", "X = a * 1.5 + 3", "s = b / X"),
    ("linear_saves_input", "X = a * 1.5", "s = F.linear(X, w)"),
    ("view_of_temporary", "X = (a * 1.5).view(4, 5)", "s = X.pow(2)"),
]
SAMPLED_WRITES = ("mul_", "imul", "setitem", "F.relu_inplace", "copy_", "exp_value", "chain")

PRELUDE = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
a = torch.randn(4, 5, requires_grad=True)
w = torch.randn(5, 5, requires_grad=True)
b = torch.randn(4, 5)
mask = torch.rand(4, 5) > 0.5
idx = torch.tensor([0, 2])
col = torch.zeros(4, 1, dtype=torch.long)
"""

REPORT = """
loss.backward()
print("ok", repr(a.grad.sum().item()), repr(a.grad.abs().sum().item()), repr(w.grad.sum().item()))
"""


def _uses(write: str) -> str:
    """What the loss adds for the names the write makes (y, g), so the repair has to keep them."""
    extra = ""
    if write.startswith("g = "):
        extra += " + g.sum()"
    if write.startswith("y = "):
        extra += " + y.sum()"
    return extra


# where the written tensor lives, by place: its spelling there
PLACES = {"top": "h", "function": "h", "module": "h", "list": "hs[0]", "dict": 'hd["h"]', "attribute": "self.h",
          "loop": "h", "helper": "h"}


def _place(context: str, make: str, save: str, write: str) -> str:
    """The program body: make X, save it, write it, and a loss that reads s, X (and y/g) in one of seven places."""
    x = PLACES[context]
    make, save, write = make.replace("X", x), save.replace("X", x), write.replace("X", x)
    if context in ("top", "list", "dict"):
        first = {"list": ["hs = [None]"], "dict": ["hd = {}"]}.get(context, [])
        return "\n".join([*first, make, save, write, f"loss = s.sum() + {x}.sum() + (w * 0).sum(){_uses(write)}"])
    if context == "function":
        body = [make, save, write, f"return s.sum() + {x}.sum() + (w * 0).sum(){_uses(write)}"]
        return "def block(a, w):\n" + textwrap.indent("\n".join(body), "    ") + "\n\n\nloss = block(a, w)"
    if context in ("module", "attribute"):
        body = [re.sub(r"\ba\b", "inp", make), re.sub(r"\bw\b", "self.w", save),
                write, f"return s.sum() + {x}.sum() + (self.w * 0).sum(){_uses(write)}"]
        return ("class Block(nn.Module):\n    def __init__(self, w):\n        super().__init__()\n        self.w = w\n\n"
                "    def forward(self, inp):\n" + textwrap.indent("\n".join(body), "        ")
                + "\n\n\nloss = Block(w)(a)")
    if context == "helper":  # the write is a helper's, on its parameter, and the helper returns nothing
        helper = re.sub(rf"\b{re.escape(x)}\b", "t", write)
        if helper.startswith(("g = ", "y = ", "t = ")):
            return _place("top", make, save, write)  # a value the caller needs: not this place's question
        return ("def update(t):\n    " + helper + "\n\n\n" + "\n".join(
            [make, save, "update(h)", "loss = s.sum() + h.sum() + (w * 0).sum()"]))
    body = [re.sub(r"\ba\b", "(a + i)", make), save, write,
            f"loss = loss + s.sum() + {x}.sum() + (w * 0).sum(){_uses(write)}"]
    return "loss = 0\nfor i in range(2):\n" + textwrap.indent("\n".join(body), "    ")


@dataclass(frozen=True)
class Cell:
    name: str
    buggy: str
    reference: str
    other_reference: str = ""  # a second repair the cell accepts (a step moved, or a fresh forward)


def _indented_reference(body: str, write: str, ref: str) -> str:
    """The reference: the buggy body with its write line replaced by clone-then-write at the same indent."""
    out = []
    for line in body.splitlines():
        if line.strip() == write:
            pad = line[: len(line) - len(line.lstrip())]
            out.extend(pad + r for r in ref.splitlines())
        else:
            out.append(line)
    return "\n".join(out)


def cells() -> list[Cell]:
    made = []
    plan = [(w, s, "top") for w in WRITES for s in SAVERS]
    plan += [(w, s, "top") for w in WRITES if w[0] in SAMPLED_WRITES for s in MORE_SAVERS]
    plan += [(w, SAVERS[0], c) for w in WRITES for c in ("function", "module", "list", "dict", "attribute", "loop",
                                                                  "helper")]
    for (wname, write), (sname, make, save), context in plan:
        x = PLACES[context]
        body = _place(context, make, save, write)
        written = "update(h)" if "update(h)" in body else write.replace("X", x)  # the helper's call, or the write
        ref = _indented_reference(body, written, f"{x} = {x}.clone()\n{written}")
        made.append(Cell(f"{context}/{sname}/{wname}", PRELUDE + "\n" + body + "\n" + REPORT,
                         PRELUDE + "\n" + ref + "\n" + REPORT))
    return made


# Modules built with inplace=True writing a tensor the module before them saved: (name, model lines). The
# reference builds the same modules with inplace=False.
MODULE_PRELUDE = PRELUDE + "x = torch.randn(4, 5)\n"
MODULES = [
    ("sequential", "net = nn.Sequential(nn.Linear(5, 5), nn.Sigmoid(), nn.ReLU(inplace=True))"),
    ("sequential_two_candidates",
     "net = nn.Sequential(nn.Linear(5, 5), nn.ReLU(inplace=True), nn.Linear(5, 5), nn.Sigmoid(),\n"
     "                    nn.ReLU(inplace=True))"),
    ("dropout_after_sigmoid", "net = nn.Sequential(nn.Linear(5, 5), nn.Sigmoid(), nn.Dropout(0.5, inplace=True))"),
    ("leaky_relu", "net = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.LeakyReLU(0.1, inplace=True))"),
    ("hardtanh", "net = nn.Sequential(nn.Linear(5, 5), nn.Sigmoid(), nn.Hardtanh(0.0, 0.5, inplace=True))"),
    ("silu", "net = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.SiLU(inplace=True))"),
    ("factory",
     "def activation():\n    return nn.ReLU(inplace=True)\n\n\n"
     "net = nn.Sequential(nn.Linear(5, 5), nn.Sigmoid(), activation())"),
    ("modulelist_comprehension",
     "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.lin = nn.Linear(5, 5)\n        self.acts = nn.ModuleList([nn.ReLU(inplace=True) for _ in range(2)])\n\n"
     "    def forward(self, x):\n        h = torch.sigmoid(self.lin(x))\n        for act in self.acts:\n"
     "            h = act(h)\n        return h\n\n\nnet = Net()"),
    ("attribute_set_later",
     "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.lin = nn.Linear(5, 5)\n        self.act = nn.ReLU()\n        self.act.inplace = True\n\n"
     "    def forward(self, x):\n        return self.act(torch.sigmoid(self.lin(x)))\n\n\nnet = Net()"),
    ("functional_flag",
     "class Net(nn.Module):\n    def __init__(self, inplace=True):\n        super().__init__()\n"
     "        self.lin = nn.Linear(5, 5)\n        self.inplace = inplace\n\n"
     "    def forward(self, x):\n        return F.relu(torch.sigmoid(self.lin(x)), inplace=self.inplace)\n\n\n"
     "net = Net()"),
]
MODULE_REPORT = """
out = net(x * a)
loss = (out * out).sum() + (w * 0).sum()
loss.backward()
print("ok", repr(a.grad.sum().item()), repr(a.grad.abs().sum().item()), repr(w.grad.sum().item()))
"""


def module_cells() -> list[Cell]:
    made = []
    for name, model in MODULES:
        reference = model.replace("inplace=True", "inplace=False").replace("self.act.inplace = True", "pass")
        made.append(Cell(f"modules/{name}", MODULE_PRELUDE + "\n" + model + "\n" + MODULE_REPORT,
                         MODULE_PRELUDE + "\n" + reference + "\n" + MODULE_REPORT))
    return made


# State carried from one step's graph into the next step's, not detached: the second backward runs into the
# first step's freed graph. (name, body with {CARRY} where the carried tensor is read into the new step, and the
# reference's spelling of that read). The reference detaches the carried state where the next step reads it
# (truncated backpropagation); retaining the graph would run but change the gradients.
CARRIED_PRELUDE = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
cell = nn.RNNCell(3, 4)
head = nn.Linear(4, 1)
opt = torch.optim.SGD(list(cell.parameters()) + list(head.parameters()), lr=0.1)
xs = torch.randn(3, 2, 3)
"""
CARRIED_REPORT = """
print("ok", repr(sum(p.sum().item() for p in cell.parameters())), repr(head.weight.sum().item()))
"""
CARRIED = [
    ("local", "h = torch.zeros(2, 4)\nfor x in xs:\n    h = cell(x, {h})\n    loss = head(h).pow(2).mean()\n"
              "    opt.zero_grad()\n    loss.backward()\n    opt.step()", "h"),
    ("attribute",
     "class Runner(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.h = torch.zeros(2, 4)\n\n    def forward(self, x):\n        self.h = cell(x, {self.h})\n"
     "        return head(self.h)\n\n\nrunner = Runner()\nfor x in xs:\n    loss = runner(x).pow(2).mean()\n"
     "    opt.zero_grad()\n    loss.backward()\n    opt.step()", "self.h"),
    ("dict", "state = {'h': torch.zeros(2, 4)}\nfor x in xs:\n    state['h'] = cell(x, {state['h']})\n"
             "    loss = head(state['h']).pow(2).mean()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()",
     "state['h']"),
    ("list", "hs = [torch.zeros(2, 4)]\nfor x in xs:\n    hs.append(cell(x, {hs[-1]}))\n"
             "    loss = head(hs[-1]).pow(2).mean()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()",
     "hs[-1]"),
    ("returned", "def step(x, h):\n    h = cell(x, h)\n    return head(h).pow(2).mean(), h\n\n\n"
                 "h = torch.zeros(2, 4)\nfor x in xs:\n    loss, h = step(x, {h})\n    opt.zero_grad()\n"
                 "    loss.backward()\n    opt.step()", "h"),
    ("running_mean", "avg = torch.zeros(4)\nfor x in xs:\n    h = cell(x)\n    avg = 0.9 * {avg} + 0.1 * h.mean(0)\n"
                     "    loss = head(h - avg).pow(2).mean()\n    opt.zero_grad()\n    loss.backward()\n"
                     "    opt.step()", "avg"),
]


# The same, with an LSTM's two-tensor state: unpacked (``h, c``), held as one tuple in an attribute, and
# nn.LSTM's ``hidden``. (name, buggy body, reference body: every carried tensor detached where the step reads it)
LSTM_PRELUDE = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
cell = nn.LSTMCell(3, 4)
lstm = nn.LSTM(3, 4, batch_first=True)
head = nn.Linear(4, 1)
opt = torch.optim.SGD(list(cell.parameters()) + list(lstm.parameters()) + list(head.parameters()), lr=0.1)
xs = torch.randn(3, 2, 3)
"""
LSTM_REPORT = """
print("ok", repr(sum(p.sum().item() for p in cell.parameters())), repr(sum(p.sum().item() for p in lstm.parameters())),
      repr(head.weight.sum().item()))
"""
_TRAIN = "    opt.zero_grad()\n    loss.backward()\n    opt.step()"
LSTM_STATES = [
    ("unpacked", "h, c = torch.zeros(2, 4), torch.zeros(2, 4)\nfor x in xs:\n    h, c = cell(x, {(h, c)})\n"
                 "    loss = head(h).pow(2).mean()\n" + _TRAIN, "(h.detach(), c.detach())"),
    ("attribute", "class Runner(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                  "        self.state = (torch.zeros(2, 4), torch.zeros(2, 4))\n\n    def forward(self, x):\n"
                  "        self.state = cell(x, {self.state})\n        return head(self.state[0])\n\n\n"
                  "runner = Runner()\nfor x in xs:\n    loss = runner(x).pow(2).mean()\n" + _TRAIN,
     "tuple(s.detach() for s in self.state)"),
    ("nn_lstm", "hidden = (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))\nfor x in xs:\n"
                "    out, hidden = lstm(x.unsqueeze(1), {hidden})\n    loss = head(out).pow(2).mean()\n" + _TRAIN,
     "tuple(s.detach() for s in hidden)"),
]


def lstm_cells() -> list[Cell]:
    made = []
    for name, body, detached in LSTM_STATES:
        read = body[body.index("{") + 1:body.index("}")]
        made.append(Cell(f"carried/lstm_{name}", LSTM_PRELUDE + "\n" + body.replace("{" + read + "}", read)
                         + "\n" + LSTM_REPORT,
                         LSTM_PRELUDE + "\n" + body.replace("{" + read + "}", detached) + "\n" + LSTM_REPORT))
    return made


def carried_cells() -> list[Cell]:
    made = []
    for name, body, carried in CARRIED:
        token = "{" + carried + "}"
        made.append(Cell(f"carried/{name}", CARRIED_PRELUDE + "\n" + body.replace(token, carried) + "\n" + CARRIED_REPORT,
                         CARRIED_PRELUDE + "\n" + body.replace(token, carried + ".detach()") + "\n" + CARRIED_REPORT))
    return made


# An optimizer step between a forward and a backward that still needs the stepped weights' saved values. The
# repair is not unique: the step moved after the last backward that needs the old weights, or a fresh forward
# after the step. Each cell lists the references it accepts (the gradients of any one of them).
STEPPED_PRELUDE = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
gen = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 2))
disc = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))
opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
z = torch.randn(8, 2)
real = torch.randn(8, 2)
"""
STEPPED_REPORT = """
print("ok", repr(sum(p.sum().item() for p in gen.parameters())), repr(sum(p.sum().item() for p in disc.parameters())))
"""
STEPPED = [
    ("gan_reused_score",
     "for _ in range(2):\n    fake = gen(z)\n    score = disc(fake)\n"
     "    loss_d = (disc(real) - score).mean()\n    opt_d.zero_grad()\n    loss_d.backward(retain_graph=True)\n"
     "    opt_d.step()\n    loss_g = score.mean()\n    opt_g.zero_grad()\n    loss_g.backward()\n    opt_g.step()",
     ["for _ in range(2):\n    fake = gen(z)\n    score = disc(fake)\n"
      "    loss_d = (disc(real) - score).mean()\n    opt_d.zero_grad()\n    loss_d.backward(retain_graph=True)\n"
      "    opt_d.step()\n    score = disc(fake)\n    loss_g = score.mean()\n    opt_g.zero_grad()\n"
      "    loss_g.backward()\n    opt_g.step()",
      "for _ in range(2):\n    fake = gen(z)\n    score = disc(fake)\n"
      "    loss_d = (disc(real) - score).mean()\n    opt_d.zero_grad()\n    loss_d.backward(retain_graph=True)\n"
      "    loss_g = score.mean()\n    opt_g.zero_grad()\n    loss_g.backward()\n    opt_d.step()\n    opt_g.step()"]),
    ("two_losses_one_forward",
     "for _ in range(2):\n    out = disc(gen(z))\n    first = out.pow(2).mean()\n    second = out.abs().mean()\n"
     "    opt_d.zero_grad()\n    first.backward(retain_graph=True)\n    opt_d.step()\n    opt_g.zero_grad()\n"
     "    second.backward()\n    opt_g.step()",
     ["for _ in range(2):\n    out = disc(gen(z))\n    first = out.pow(2).mean()\n    second = out.abs().mean()\n"
      "    opt_d.zero_grad()\n    first.backward(retain_graph=True)\n    opt_g.zero_grad()\n"
      "    second.backward()\n    opt_d.step()\n    opt_g.step()",
      "for _ in range(2):\n    out = disc(gen(z))\n    first = out.pow(2).mean()\n    second = out.abs().mean()\n"
      "    opt_d.zero_grad()\n    first.backward(retain_graph=True)\n    opt_d.step()\n    opt_g.zero_grad()\n"
      "    out = disc(gen(z))\n    second = out.abs().mean()\n    second.backward()\n    opt_g.step()"]),
    ("critic_value_before_step",
     "def losses(states):\n    value = disc(gen(states))\n    return value, value.pow(2).mean()\n\n\n"
     "for _ in range(2):\n    value, critic_loss = losses(z)\n    opt_d.zero_grad()\n"
     "    critic_loss.backward(retain_graph=True)\n    opt_d.step()\n    actor_loss = -value.mean()\n"
     "    opt_g.zero_grad()\n    actor_loss.backward()\n    opt_g.step()",
     ["def losses(states):\n    value = disc(gen(states))\n    return value, value.pow(2).mean()\n\n\n"
      "for _ in range(2):\n    value, critic_loss = losses(z)\n    opt_d.zero_grad()\n"
      "    critic_loss.backward(retain_graph=True)\n    actor_loss = -value.mean()\n"
      "    opt_g.zero_grad()\n    actor_loss.backward()\n    opt_d.step()\n    opt_g.step()",
      "def losses(states):\n    value = disc(gen(states))\n    return value, value.pow(2).mean()\n\n\n"
      "for _ in range(2):\n    value, critic_loss = losses(z)\n    opt_d.zero_grad()\n"
      "    critic_loss.backward(retain_graph=True)\n    opt_d.step()\n    value, critic_loss = losses(z)\n"
      "    actor_loss = -value.mean()\n    opt_g.zero_grad()\n    actor_loss.backward()\n    opt_g.step()"]),
    # the update in a helper each loss goes through: no step can move within it; the second loss is recomputed
    ("update_helper",
     "def update(opt, loss):\n    opt.zero_grad()\n    loss.backward(retain_graph=True)\n    opt.step()\n\n\n"
     "for _ in range(2):\n    fake = gen(z)\n    score = disc(fake)\n    loss_d = (disc(real) - score).mean()\n"
     "    update(opt_d, loss_d)\n    loss_g = score.mean()\n    update(opt_g, loss_g)",
     ["def update(opt, loss):\n    opt.zero_grad()\n    loss.backward(retain_graph=True)\n    opt.step()\n\n\n"
      "for _ in range(2):\n    fake = gen(z)\n    score = disc(fake)\n    loss_d = (disc(real) - score).mean()\n"
      "    update(opt_d, loss_d)\n    score = disc(fake)\n    loss_g = score.mean()\n    update(opt_g, loss_g)"]),
    # one encoder under two heads; the first head's optimizer also steps the encoder
    ("shared_encoder",
     "opt_both = torch.optim.SGD(list(gen.parameters()) + list(disc.parameters()), lr=0.1)\n"
     "head = nn.Linear(2, 1)\nopt_head = torch.optim.SGD(head.parameters(), lr=0.1)\n"
     "for _ in range(2):\n    feat = gen(z)\n    value_loss = disc(feat).pow(2).mean()\n    opt_both.zero_grad()\n"
     "    value_loss.backward(retain_graph=True)\n    opt_both.step()\n    policy_loss = head(feat).mean()\n"
     "    opt_head.zero_grad()\n    policy_loss.backward()\n    opt_head.step()",
     ["opt_both = torch.optim.SGD(list(gen.parameters()) + list(disc.parameters()), lr=0.1)\n"
      "head = nn.Linear(2, 1)\nopt_head = torch.optim.SGD(head.parameters(), lr=0.1)\n"
      "for _ in range(2):\n    feat = gen(z)\n    value_loss = disc(feat).pow(2).mean()\n    opt_both.zero_grad()\n"
      "    value_loss.backward(retain_graph=True)\n    opt_both.step()\n    feat = gen(z)\n"
      "    policy_loss = head(feat).mean()\n    opt_head.zero_grad()\n    policy_loss.backward()\n    opt_head.step()",
      "opt_both = torch.optim.SGD(list(gen.parameters()) + list(disc.parameters()), lr=0.1)\n"
      "head = nn.Linear(2, 1)\nopt_head = torch.optim.SGD(head.parameters(), lr=0.1)\n"
      "for _ in range(2):\n    feat = gen(z)\n    value_loss = disc(feat).pow(2).mean()\n    opt_both.zero_grad()\n"
      "    value_loss.backward(retain_graph=True)\n    policy_loss = head(feat).mean()\n"
      "    opt_head.zero_grad()\n    policy_loss.backward()\n    opt_both.step()\n    opt_head.step()"]),
]


def stepped_cells() -> list[Cell]:
    return [Cell(f"stepped/{name}", STEPPED_PRELUDE + "\n" + body + "\n" + STEPPED_REPORT,
                 *[STEPPED_PRELUDE + "\n" + r + "\n" + STEPPED_REPORT for r in refs]) for name, body, refs in STEPPED]


# Writes autograd refuses whatever is saved: into a leaf that requires grad (an initialisation, a hand-written
# update) and into a view of several outputs or of a leaf. (name, buggy body, reference body)
LEAF_PRELUDE = """\
import torch

torch.manual_seed(0)
w = torch.randn(4, 3, requires_grad=True)
x = torch.randn(5, 4)
"""
LEAF_REPORT = """
print("ok", repr(w.grad.sum().item()), repr(w.sum().item()))
"""
LEAVES = [
    ("init_scaled", "w.mul_(0.1)\nloss = (x @ w).pow(2).sum()\nloss.backward()",
     "with torch.no_grad():\n    w.mul_(0.1)\nloss = (x @ w).pow(2).sum()\nloss.backward()"),
    ("init_row_set", "w[0] = 0.0\nloss = (x @ w).pow(2).sum()\nloss.backward()",
     "with torch.no_grad():\n    w[0] = 0.0\nloss = (x @ w).pow(2).sum()\nloss.backward()"),
    ("manual_update",
     "for _ in range(2):\n    loss = (x @ w).pow(2).sum()\n    w.grad = None\n    loss.backward()\n"
     "    w -= 0.01 * w.grad\nloss = (x @ w).pow(2).sum()\nloss.backward()",
     "for _ in range(2):\n    loss = (x @ w).pow(2).sum()\n    w.grad = None\n    loss.backward()\n"
     "    with torch.no_grad():\n        w -= 0.01 * w.grad\nloss = (x @ w).pow(2).sum()\nloss.backward()"),
    ("view_of_leaf", "v = w[:2]\nv.mul_(2)\nloss = (x @ w).pow(2).sum() + v.sum()\nloss.backward()",
     "v = w[:2]\nwith torch.no_grad():\n    v.mul_(2)\nloss = (x @ w).pow(2).sum() + v.sum()\nloss.backward()"),
    ("chunk_output", "h = x @ w\na, b = h.chunk(2, dim=1)\na.relu_()\nloss = a.sum() + b.pow(2).sum()\nloss.backward()",
     "h = x @ w\na, b = h.chunk(2, dim=1)\na = a.relu()\nloss = a.sum() + b.pow(2).sum()\nloss.backward()"),
    ("unbind_output", "h = x @ w\nfirst, *rest = h.unbind(1)\nfirst.mul_(2)\nloss = first.sum() + rest[0].pow(2).sum()\n"
                      "loss.backward()",
     "h = x @ w\nfirst, *rest = h.unbind(1)\nfirst = first.mul(2)\nloss = first.sum() + rest[0].pow(2).sum()\n"
     "loss.backward()"),
    ("split_in_loop", "h = x @ w\nparts = h.split(2, dim=0)\nfor p in parts:\n    p.mul_(0.5)\n"
                      "loss = sum(p.pow(2).sum() for p in parts)\nloss.backward()",
     "h = x @ w\nparts = [p.clone() for p in h.split(2, dim=0)]\nfor p in parts:\n    p.mul_(0.5)\n"
     "loss = sum(p.pow(2).sum() for p in parts)\nloss.backward()"),
    # more writes into a loop's variable, written after split_in_loop was refused: pieces of chunk and unbind,
    # tensors an op saved held in a list, pieces handed to a helper
    ("chunk_in_loop", "h = x @ w\nheads = h.chunk(3, dim=1)\nfor q in heads:\n    q.clamp_(min=0)\n"
                      "loss = sum(q.pow(2).sum() for q in heads)\nloss.backward()",
     "h = x @ w\nheads = [q.clone() for q in h.chunk(3, dim=1)]\nfor q in heads:\n    q.clamp_(min=0)\n"
     "loss = sum(q.pow(2).sum() for q in heads)\nloss.backward()"),
    ("unbind_in_loop", "rows = (x @ w).unbind(0)\nfor r in rows:\n    r.mul_(2)\nloss = torch.stack(rows).pow(2).sum()\n"
                       "loss.backward()",
     "rows = [r.clone() for r in (x @ w).unbind(0)]\nfor r in rows:\n    r.mul_(2)\n"
     "loss = torch.stack(rows).pow(2).sum()\nloss.backward()"),
    ("saved_list_in_loop", "acts = [torch.sigmoid(x @ w), torch.tanh(x @ w)]\nfor t in acts:\n    t.mul_(0.5)\n"
                           "loss = sum(t.sum() for t in acts)\nloss.backward()",
     "acts = [torch.sigmoid(x @ w).clone(), torch.tanh(x @ w).clone()]\nfor t in acts:\n    t.mul_(0.5)\n"
     "loss = sum(t.sum() for t in acts)\nloss.backward()"),
    ("split_in_helper_loop", "def halve(parts):\n    for p in parts:\n        p.mul_(0.5)\n    return parts\n\n\n"
                             "parts = halve((x @ w).split(2, dim=0))\nloss = sum(p.pow(2).sum() for p in parts)\n"
                             "loss.backward()",
     "def halve(parts):\n    for p in parts:\n        p.mul_(0.5)\n    return parts\n\n\n"
     "parts = halve([p.clone() for p in (x @ w).split(2, dim=0)])\nloss = sum(p.pow(2).sum() for p in parts)\n"
     "loss.backward()"),
]


def leaf_cells() -> list[Cell]:
    return [Cell(f"leaf_view/{name}", LEAF_PRELUDE + "\n" + body + "\n" + LEAF_REPORT,
                 LEAF_PRELUDE + "\n" + ref + "\n" + LEAF_REPORT) for name, body, ref in LEAVES]


# A buffer filled step by step from its own earlier entries (a recurrence into a preallocated tensor): each step's
# read of an earlier entry is saved, and the next step's write bumps the whole buffer's version. (name, buggy body,
# reference body: the read cloned)
BUFFER_PRELUDE = """\
import torch

torch.manual_seed(0)
w = torch.randn(3, 3, requires_grad=True)
x0 = torch.randn(3)
"""
BUFFER_REPORT = """
loss = out.pow(2).sum()
loss.backward()
print("ok", repr(w.grad.sum().item()), repr(w.grad.abs().sum().item()))
"""
BUFFERS = [
    ("row_assign", "out = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n    out[t] = torch.tanh(out[t - 1] @ w)",
     "out = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n    out[t] = torch.tanh(out[t - 1].clone() @ w)"),
    ("column_assign",
     "out = torch.zeros(3, 4)\nout[:, 0] = x0\nfor t in range(1, 4):\n    out[:, t] = torch.tanh(w @ out[:, t - 1])",
     "out = torch.zeros(3, 4)\nout[:, 0] = x0\nfor t in range(1, 4):\n    out[:, t] = torch.tanh(w @ out[:, t - 1].clone())"),
    ("row_copy", "out = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n    out[t].copy_(torch.tanh(out[t - 1] @ w))",
     "out = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n    out[t].copy_(torch.tanh(out[t - 1].clone() @ w))"),
    ("previous_named",
     "out = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n    prev = out[t - 1]\n    out[t] = torch.tanh(prev @ w)",
     "out = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n    prev = out[t - 1].clone()\n"
     "    out[t] = torch.tanh(prev @ w)"),
    ("helper_step",
     "def step(h):\n    return torch.tanh(h @ w)\n\n\nout = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n"
     "    out[t] = step(out[t - 1])",
     "def step(h):\n    return torch.tanh(h @ w)\n\n\nout = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n"
     "    out[t] = step(out[t - 1].clone())"),
    ("accumulated", "out = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n    out[t] += torch.sigmoid(out[t - 1] @ w)",
     "out = torch.zeros(4, 3)\nout[0] = x0\nfor t in range(1, 4):\n    out[t] += torch.sigmoid(out[t - 1].clone() @ w)"),
]


def buffer_cells() -> list[Cell]:
    return [Cell(f"buffer/{name}", BUFFER_PRELUDE + "\n" + body + "\n" + BUFFER_REPORT,
                 BUFFER_PRELUDE + "\n" + ref + "\n" + BUFFER_REPORT) for name, body, ref in BUFFERS]


# More write spellings, each on two savers at the top level: shape changes in place (autograd counts them as
# writes), unary and binary methods, functional in-place calls, augmented item writes. (``out=`` into the operand
# is refused by autograd itself whenever it records: no cell.)
MORE_WRITES = [
    ("unsqueeze_", "X.unsqueeze_(0)"),
    ("t_", "X.t_()"),
    ("transpose_", "X.transpose_(0, 1)"),
    ("abs_", "X.abs_()"),
    ("neg_", "X.neg_()"),
    ("sub_", "X.sub_(b)"),
    ("div_tensor", "X.div_(b.abs() + 1)"),
    ("clamp_max_", "X.clamp_max_(0.5)"),
    ("square_", "X.square_()"),
    ("sign_", "X.sign_()"),
    ("floor_", "X.floor_()"),
    ("relu_method", "X.relu_()"),
    ("index_add_", "X.index_add_(1, idx, b[:, :2])"),
    ("torch.clamp_", "torch.clamp_(X, 0, 1)"),
    ("torch.sigmoid_", "torch.sigmoid_(X)"),
    ("setitem_index_iadd", "X[idx] += 1"),
    ("setitem_slice_imul", "X[..., :2] *= 2"),
    ("F.dropout_inplace", "F.dropout(X, 0.5, True, True)"),
    # a third set, written after the second was all right: ops whose out-of-place form takes other arguments or
    # does not exist (random fills), functional calls with a positional or keyword in-place flag, a write inside a
    # lambda or a comprehension
    ("nan_to_num_", "X.nan_to_num_()"),
    ("clip_", "X.clip_(-0.5, 0.5)"),
    ("sin_", "X.sin_()"),
    ("erf_", "X.erf_()"),
    ("reciprocal_", "X.reciprocal_()"),
    ("put_", "X.put_(idx, b[0, :2])"),
    ("index_copy_", "X.index_copy_(0, idx, b[:2])"),
    ("scatter_add_", "X.scatter_add_(1, col, b[:, :1])"),
    ("masked_scatter_", "X.masked_scatter_(mask, b)"),
    ("addmm_", "X.addmm_(b, w)"),
    ("uniform_", "X.uniform_()"),
    ("normal_", "X.normal_()"),
    ("renorm_", "X.renorm_(2, 0, 1.0)"),
    ("copysign_", "X.copysign_(b)"),
    ("F.hardtanh_statement", "F.hardtanh(X, -0.5, 0.5, inplace=True)"),
    ("F.leaky_relu_positional", "F.leaky_relu(X, 0.2, True)"),
    ("F.threshold_", "F.threshold_(X, 0.1, 0.0)"),
    ("lambda_write", "scale = lambda t: t.mul_(2)\nX = scale(X)"),
    ("comprehension_write", "X = [t.mul_(2) for t in [X]][0]"),
    ("baddbmm_view", "X.unsqueeze(0).baddbmm_(b.unsqueeze(0), w.unsqueeze(0))"),
    ("div_floor", "X.div_(2, rounding_mode='floor')"),
    ("mul_scalar_tensor", "X.mul_(torch.tensor(2.0))"),
    ("exponential_", "X.exponential_()"),
    ("bernoulli_", "X.bernoulli_(0.5)"),
]


def more_write_cells() -> list[Cell]:
    made = []
    for wname, write in MORE_WRITES:
        for sname, make, save in (SAVERS[0], SAVERS[2]):
            body = _place("top", make, save, write)
            first = write.split("\n")[0].replace("X", "h")  # the reference clones before the write's first line
            ref = _indented_reference(body, first, "h = h.clone()\n" + first)
            made.append(Cell(f"top/{sname}/{wname}", PRELUDE + "\n" + body + "\n" + REPORT,
                             PRELUDE + "\n" + ref + "\n" + REPORT))
    return made


# A backward through a graph an earlier backward already freed, within one step (no state carried across steps):
# two losses of one forward, micro-batches of one shared feature, autograd.grad then backward, a GAN whose
# critic loss runs through the generator, a feature computed once before the loop. (name, body, references)
TWICE_PRELUDE = STEPPED_PRELUDE
TWICE_REPORT = STEPPED_REPORT
TWICE = [
    ("two_losses",
     "for _ in range(2):\n    out = disc(gen(z))\n    first = out.pow(2).mean()\n    second = out.abs().mean()\n"
     "    opt_d.zero_grad()\n    first.backward()\n    second.backward()\n    opt_d.step()",
     ["for _ in range(2):\n    out = disc(gen(z))\n    first = out.pow(2).mean()\n    second = out.abs().mean()\n"
      "    opt_d.zero_grad()\n    first.backward(retain_graph=True)\n    second.backward()\n    opt_d.step()"]),
    ("micro_batches",
     "for _ in range(2):\n    feat = gen(z)\n    opt_g.zero_grad()\n    for i in range(2):\n"
     "        loss = disc(feat[i::2]).pow(2).mean()\n        loss.backward()\n    opt_g.step()",
     ["for _ in range(2):\n    feat = gen(z)\n    opt_g.zero_grad()\n    for i in range(2):\n"
      "        loss = disc(feat[i::2]).pow(2).mean()\n        loss.backward(retain_graph=True)\n    opt_g.step()"]),
    ("grad_then_backward",
     "for _ in range(2):\n    loss = disc(gen(z)).pow(2).mean()\n"
     "    norms = torch.autograd.grad(loss, list(gen.parameters()))\n    opt_g.zero_grad()\n    loss.backward()\n"
     "    opt_g.step()",
     ["for _ in range(2):\n    loss = disc(gen(z)).pow(2).mean()\n"
      "    norms = torch.autograd.grad(loss, list(gen.parameters()), retain_graph=True)\n    opt_g.zero_grad()\n"
      "    loss.backward()\n    opt_g.step()"]),
    ("gan_fake_not_detached",
     "for _ in range(2):\n    fake = gen(z)\n    loss_d = (disc(fake) - disc(real)).mean()\n    opt_d.zero_grad()\n"
     "    loss_d.backward()\n    opt_d.step()\n    loss_g = -disc(fake).mean()\n    opt_g.zero_grad()\n"
     "    loss_g.backward()\n    opt_g.step()",
     ["for _ in range(2):\n    fake = gen(z)\n    loss_d = (disc(fake.detach()) - disc(real)).mean()\n"
      "    opt_d.zero_grad()\n    loss_d.backward()\n    opt_d.step()\n    loss_g = -disc(fake).mean()\n"
      "    opt_g.zero_grad()\n    loss_g.backward()\n    opt_g.step()"]),
    ("feature_before_loop",
     "feat = gen(z)\nfor _ in range(2):\n    loss = disc(feat).pow(2).mean()\n    opt_g.zero_grad()\n"
     "    opt_d.zero_grad()\n    loss.backward()\n    opt_g.step()\n    opt_d.step()",
     ["for _ in range(2):\n    feat = gen(z)\n    loss = disc(feat).pow(2).mean()\n    opt_g.zero_grad()\n"
      "    opt_d.zero_grad()\n    loss.backward()\n    opt_g.step()\n    opt_d.step()"]),
    ("penalty_in_helper",
     "def penalise(out):\n    penalty = out.abs().mean()\n    penalty.backward()\n\n\n"
     "for _ in range(2):\n    out = disc(gen(z))\n    loss = out.pow(2).mean()\n    opt_d.zero_grad()\n"
     "    loss.backward()\n    penalise(out)\n    opt_d.step()",
     ["def penalise(out):\n    penalty = out.abs().mean()\n    penalty.backward()\n\n\n"
      "for _ in range(2):\n    out = disc(gen(z))\n    loss = out.pow(2).mean()\n    opt_d.zero_grad()\n"
      "    loss.backward(retain_graph=True)\n    penalise(out)\n    opt_d.step()"]),
]

# A hand-written in-place update of parameters between a forward and its backward (weight decay, clipping,
# renormalising by hand, in a helper): the repair moves it after the backward (before or after the step).
HANDSTEP = [
    ("decay_loop",
     "for _ in range(2):\n    loss = disc(gen(z)).pow(2).mean()\n    with torch.no_grad():\n"
     "        for p in disc.parameters():\n            p.mul_(0.99)\n    opt_d.zero_grad()\n    loss.backward()\n"
     "    opt_d.step()"),
    ("clip_critic",
     "for _ in range(2):\n    loss = (disc(gen(z).detach()) - disc(real)).mean()\n    with torch.no_grad():\n"
     "        for p in disc.parameters():\n            p.clamp_(-0.3, 0.3)\n    opt_d.zero_grad()\n    loss.backward()\n"
     "    opt_d.step()"),
    ("renorm_first_layer",
     "for _ in range(2):\n    loss = disc(gen(z)).pow(2).mean()\n    with torch.no_grad():\n"
     "        disc[0].weight.div_(disc[0].weight.norm())\n    opt_d.zero_grad()\n    loss.backward()\n"
     "    opt_d.step()"),
    ("decay_helper",
     "def decay(model):\n    with torch.no_grad():\n        for p in model.parameters():\n            p.mul_(0.99)\n\n\n"
     "for _ in range(2):\n    loss = disc(gen(z)).pow(2).mean()\n    decay(disc)\n    opt_d.zero_grad()\n"
     "    loss.backward()\n    opt_d.step()"),
]


def _moved_after(body: str, block: list[str], anchor: str) -> str:
    """``body`` with the lines ``block`` moved to just after the line ``anchor``."""
    lines = body.split("\n")
    start = lines.index(block[0])
    del lines[start:start + len(block)]
    at = lines.index(anchor) + 1
    return "\n".join(lines[:at] + block + lines[at:])


def twice_cells() -> list[Cell]:
    made = [Cell(f"twice/{name}", TWICE_PRELUDE + "\n" + body + "\n" + TWICE_REPORT,
                 *[TWICE_PRELUDE + "\n" + r + "\n" + TWICE_REPORT for r in refs]) for name, body, refs in TWICE]
    for name, body in HANDSTEP:
        lines = body.split("\n")
        loop = lines.index("for _ in range(2):")
        first = next(i for i, ln in enumerate(lines) if i > loop and ("no_grad" in ln or ln.strip() == "decay(disc)"))
        last = first
        while last + 1 < len(lines) and len(lines[last + 1]) - len(lines[last + 1].lstrip()) > 4:
            last += 1
        block = lines[first:last + 1]
        refs = [_moved_after(body, block, "    loss.backward()"), _moved_after(body, block, "    opt_d.step()")]
        made.append(Cell(f"handstep/{name}", TWICE_PRELUDE + "\n" + body + "\n" + TWICE_REPORT,
                         *[TWICE_PRELUDE + "\n" + r + "\n" + TWICE_REPORT for r in refs]))
    return made


# Writes made by a hook, not the forward's own code: a forward hook or a pre-hook writing the tensor the module
# before saved. The reference returns the new value instead of writing it.
HOOK_PRELUDE = MODULE_PRELUDE + "net = nn.Sequential(nn.Linear(5, 5), nn.Sigmoid(), nn.Linear(5, 5))\n"
HOOKS = [
    ("forward_hook_lambda", "net[1].register_forward_hook(lambda m, i, o: o.mul_(2))",
     "net[1].register_forward_hook(lambda m, i, o: o.mul(2))"),
    ("forward_hook_def", "def scale(module, inputs, output):\n    output.mul_(2)\n\n\n"
                         "net[1].register_forward_hook(scale)",
     "def scale(module, inputs, output):\n    return output.mul(2)\n\n\nnet[1].register_forward_hook(scale)"),
    ("pre_hook", "net[2].register_forward_pre_hook(lambda m, i: i[0].clamp_(max=0.5))",
     "net[2].register_forward_pre_hook(lambda m, i: (i[0].clamp(max=0.5),))"),
]


def hook_cells() -> list[Cell]:
    return [Cell(f"hooks/{name}", HOOK_PRELUDE + "\n" + body + "\n" + MODULE_REPORT,
                 HOOK_PRELUDE + "\n" + ref + "\n" + MODULE_REPORT) for name, body, ref in HOOKS]



# In-place modules whose write autograd refuses on the spot, not at backward: the tensor they write is the output of a
# module with a full backward hook (a view the hook's Function returned) or a `chunk` output. The write is in
# torch's code, called from the user's line; the reference builds the writing module with inplace=False.
REFUSED = [
    ("backward_hook_sequential",
     "net = nn.Sequential(nn.Linear(5, 5), nn.ReLU(inplace=True), nn.Linear(5, 5))\n"
     "net[0].register_full_backward_hook(lambda m, gi, go: None)"),
    ("backward_hook_nested",
     "net = nn.Sequential(nn.Sequential(nn.Linear(5, 5), nn.LeakyReLU(0.1, inplace=True)), nn.Linear(5, 5))\n"
     "net[0][0].register_full_backward_hook(lambda m, gi, go: None)"),
    ("backward_hook_attribute",
     "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.lin = nn.Linear(5, 5)\n        self.act = nn.ELU(inplace=True)\n\n"
     "    def forward(self, x):\n        return self.act(self.lin(x))\n\n\n"
     "net = Net()\nnet.lin.register_full_backward_hook(lambda m, gi, go: None)"),
    ("backward_hook_inner_sequential",
     "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.lin = nn.Linear(5, 5)\n        self.head = nn.Sequential(nn.Hardtanh(-0.5, 0.5, inplace=True), "
     "nn.Linear(5, 5))\n\n"
     "    def forward(self, x):\n        return self.head(self.lin(x))\n\n\n"
     "net = Net()\nnet.lin.register_full_backward_hook(lambda m, gi, go: None)"),
    ("global_backward_hook",
     "net = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 5), nn.ReLU6(inplace=True))\n"
     "hook = torch.nn.modules.module.register_module_full_backward_hook(lambda m, gi, go: None)"),
    ("chunk_into_sequential",
     "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.lin = nn.Linear(5, 6)\n        self.gate = nn.Sequential(nn.SiLU(inplace=True))\n\n"
     "    def forward(self, x):\n        a, b = self.lin(x).chunk(2, dim=1)\n"
     "        return torch.cat([self.gate(a), b, a[:, :1] * 0], dim=1)[:, :5]\n\n\nnet = Net()"),
]


def refused_cells() -> list[Cell]:
    return [Cell(f"refused/{name}", MODULE_PRELUDE + "\n" + model + "\n" + MODULE_REPORT,
                 MODULE_PRELUDE + "\n" + model.replace("inplace=True", "inplace=False") + "\n" + MODULE_REPORT)
            for name, model in REFUSED]


# Programs of classes the families above do not hold, written from public patterns before any repair existed for
# them: a write through `out=` (into a saved activation, a buffer of a concatenation, a parameter filled in
# `__init__`), a recurrent state kept in a dict, a gradient penalty's `autograd.grad` freeing the graph its loss
# goes through, and autograd switched off in place (`detach_()` on a view, `requires_grad_(False)` and
# `requires_grad = False` on a computed tensor), an LSTM's (h, c) kept on a plain trainer object by one method and
# fed back by the next call. First contact: 0 of 10 right (9 refused, the penalty made to run by retain_graph with
# its gradient silently dropped).
FRESH = [
    ("out_keyword_on_saved", """
a = torch.randn(4, 3, requires_grad=True)
y = torch.sigmoid(a)
torch.mul(y, 2.0, out=y)
y.sum().backward()
print("ok", a.grad.sum().item())
""", "torch.mul(y, 2.0, out=y)", "y = torch.mul(y, 2.0)"),
    ("out_keyword_cat_buffer", """
w = torch.randn(3, 3, requires_grad=True)
parts = [torch.randn(2, 3) @ w for _ in range(3)]
buf = torch.empty(6, 3)
torch.cat(parts, dim=0, out=buf)
buf.pow(2).sum().backward()
print("ok", w.grad.sum().item())
""", "torch.cat(parts, dim=0, out=buf)", "buf = torch.cat(parts, dim=0)"),
    ("out_keyword_parameter_init", """
class Bessel(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.freq = nn.Parameter(torch.empty(n))
        torch.linspace(1.0, 3.0, n, out=self.freq)

    def forward(self, d):
        return torch.sin(self.freq * d[:, None]) / d[:, None]


m = Bessel(4)
m(torch.rand(5) + 0.5).sum().backward()
print("ok", m.freq.grad.sum().item())
""", "        torch.linspace(1.0, 3.0, n, out=self.freq)",
     "        with torch.no_grad():\n            self.freq.copy_(torch.linspace(1.0, 3.0, n))"),
    ("dict_state", """
rnn = nn.GRUCell(4, 8)
opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
state = {"h": torch.zeros(2, 8)}
for step in range(3):
    state["h"] = rnn(torch.randn(2, 4), state["h"])
    loss = state["h"].pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("ok", loss.item())
""", '    state["h"] = rnn(torch.randn(2, 4), state["h"])', '    state["h"] = rnn(torch.randn(2, 4), state["h"].detach())'),
    ("gradient_penalty", """
net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
x = torch.randn(5, 3, requires_grad=True)
y = net(x).sum()
(gx,) = torch.autograd.grad(y, x)
penalty = gx.pow(2).sum()
(y + penalty).backward()
print("ok", net[0].weight.grad.sum().item())
""", "(gx,) = torch.autograd.grad(y, x)", "(gx,) = torch.autograd.grad(y, x, create_graph=True)"),
    ("detach_view_inplace", """
lstm = nn.LSTM(3, 4, batch_first=True)
out, (h, c) = lstm(torch.randn(2, 6, 3))
last = out[:, -1]
last.detach_()
(last.sum() + h.sum()).backward()
print("ok", lstm.weight_ih_l0.grad.sum().item())
""", "last.detach_()", "last = last.detach()"),
    ("detach_chunk_in_helper", """
def split_stop_gradient(z):
    mean, logvar = z.chunk(2, dim=-1)
    logvar.detach_()
    return mean, logvar


enc = nn.Linear(5, 8)
mean, logvar = split_stop_gradient(enc(torch.randn(3, 5)))
(mean.pow(2).mean() + logvar.exp().mean()).backward()
print("ok", enc.weight.grad.sum().item())
""", "    logvar.detach_()", "    logvar = logvar.detach()"),
    ("requires_grad_off_call", """
teacher, student = nn.Linear(4, 4), nn.Linear(4, 4)
x = torch.randn(8, 4)
target = teacher(x)
target.requires_grad_(False)
(student(x) - target).pow(2).mean().backward()
print("ok", student.weight.grad.sum().item())
""", "target.requires_grad_(False)", "target = target.detach()"),
    ("requires_grad_off_attribute", """
class Distill(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        feats = self.backbone(x)
        feats.requires_grad = False
        return self.head(feats)


model = Distill()
model(torch.randn(4, 6)).pow(2).mean().backward()
print("ok", model.head.weight.grad.sum().item())
""", "        feats.requires_grad = False", "        feats = feats.detach()"),
]
FRESH.append(("tuple_state_on_a_trainer", """
class Trainer:
    def __init__(self):
        self.model = nn.LSTM(3, 6, batch_first=True)
        self.head = nn.Linear(6, 1)
        self.opt = torch.optim.Adam(list(self.model.parameters()) + list(self.head.parameters()), lr=1e-3)
        self.hidden = None

    def training_step(self, batch):
        out, self.hidden = self.model(batch, self.hidden)
        return self.head(out[:, -1]).pow(2).mean()

    def fit(self, steps):
        for _ in range(steps):
            loss = self.training_step(torch.randn(2, 5, 3))
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return loss


print("ok", Trainer().fit(3).item())
""", "        out, self.hidden = self.model(batch, self.hidden)",
    "        out, self.hidden = self.model(batch, self.hidden)\n"
    "        self.hidden = tuple(h.detach() for h in self.hidden)"))
FRESH_PRELUDE = "import torch\nimport torch.nn as nn\n\ntorch.manual_seed(0)\n"


def fresh_cells() -> list[Cell]:
    cells_ = []
    for name, body, write, fixed in FRESH:
        assert write in body.splitlines(), name
        cells_.append(Cell(f"fresh/{name}", FRESH_PRELUDE + body, FRESH_PRELUDE + body.replace(write, fixed, 1)))
    return cells_


def _env(src: str) -> dict:
    return dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")


def _plain(path: str, cwd: str, src: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, path], cwd=cwd, capture_output=True, text=True, timeout=300, env=_env(src))


def _close(got: str, want: str) -> bool:
    g, r = got.split(), want.split()
    if len(g) != len(r) or not g or g[0] != "ok":
        return False
    return all(abs(float(x) - float(y)) <= 1e-5 * max(1.0, abs(float(y))) for x, y in zip(g[1:], r[1:]))


def score(cell: Cell, src: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="gg_grid_") as tmp:
        ref_path, path = os.path.join(tmp, "reference.py"), os.path.join(tmp, "repro.py")
        with open(ref_path, "w", encoding="utf-8") as fh:
            fh.write(cell.reference)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(cell.buggy)
        references = [_plain(ref_path, tmp, src)]
        if cell.other_reference:
            with open(ref_path, "w", encoding="utf-8") as fh:
                fh.write(cell.other_reference)
            references.append(_plain(ref_path, tmp, src))
        wants = [r.stdout.strip() for r in references]
        before = _plain(path, tmp, src)
        failed = [r for r in references if r.returncode != 0]
        row = {"cell": cell.name, "reference_ok": not failed, "buggy_fails": before.returncode != 0}
        if not (row["reference_ok"] and row["buggy_fails"]):
            why = failed[0].stderr if failed else "the buggy program runs clean: " + before.stdout
            row.update(ok=None, note="cell invalid: " + why.strip()[-300:])
            return row
        try:
            fix = subprocess.run([sys.executable, "-m", "gradguard", "fix", "--apply", "repro.py"], cwd=tmp,
                                 capture_output=True, text=True, timeout=timeout, env=_env(src))
        except subprocess.TimeoutExpired:
            row.update(ok=False, note="fix timed out")
            return row
        with open(path, encoding="utf-8") as fh:
            edited = fh.read()
        after = _plain(path, tmp, src)
        if after.returncode != 0:
            row.update(ok=False, note=f"fix exit {fix.returncode}: " + (fix.stdout + fix.stderr).strip()[-400:])
        elif not any(_close(after.stdout.strip(), w) for w in wants):
            row.update(ok=False, note=f"runs, gradients differ: {after.stdout.strip()} vs {' or '.join(wants)}")
        else:
            row.update(ok=True, note="")
        row["diff"] = [ln for ln in edited.splitlines() if ln not in cell.buggy.splitlines()]
        return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="")
    parser.add_argument("--src", default=os.path.join(ROOT, "src"))
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    chosen = [c for c in cells() + module_cells() + carried_cells() + lstm_cells() + stepped_cells() + leaf_cells() + buffer_cells()
              + more_write_cells() + twice_cells() + hook_cells() + refused_cells() + fresh_cells()
              if args.only in c.name]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda c: score(c, args.src, args.timeout), chosen))
    valid = [r for r in rows if r["ok"] is not None]
    right = sum(r["ok"] for r in valid)
    for r in rows:
        if not r["ok"]:
            print(f"{'INVALID' if r['ok'] is None else 'WRONG  '} {r['cell']}: {r['note'][:300]}")
    print(f"repaired right: {right}/{len(valid)} ({len(rows) - len(valid)} invalid)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "grid.json"), "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
        with open(os.path.join(args.out, "grid.md"), "w", encoding="utf-8") as fh:
            fh.write(render_markdown(rows))
    return 0


def render_markdown(rows: list[dict]) -> str:
    """Repaired right per place, per saver and per write spelling (a cell counts in one row of each table)."""
    valid = [r for r in rows if r["ok"] is not None]
    out = [f"repaired right: {sum(r['ok'] for r in valid)}/{len(valid)}", ""]
    for axis, title in ((0, "place"), (1, "saver"), (2, "write")):
        groups: dict[str, list[bool]] = {}
        for r in valid:
            parts = r["cell"].split("/")
            key = parts[axis] if len(parts) > 2 else (parts[0] if axis == 0 else "-" if axis == 1 else parts[1])
            groups.setdefault(key, []).append(r["ok"])
        out += [f"| {title} | right |", "|---|---|"]
        out += [f"| {k} | {sum(v)}/{len(v)} |" for k, v in groups.items()]
        out.append("")
    wrong = [r for r in valid if not r["ok"]]
    out += ["wrong: " + (", ".join(r["cell"] for r in wrong) if wrong else "none"), ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
