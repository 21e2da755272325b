"""End to end, the general repair search of ``gradguard fix`` (NOTE [Repairs from the mechanism, not the rule
id]): small reproductions of public reports the rule catalogue refused, each repaired by ``gradguard fix --apply``
on a copy, with the exact edit asserted and the edited script run again, plain, to a clean exit.

CI's selection (CI=true: -m "not exhaustive") keeps the cases whose repair no cheaper test derives; a case marked
`exhaustive` is one whose repair a CI-selected test already derives from the same shape, named at its marker, and
the cases left in CI run the whole pipeline (run, search, verify, apply, plain run) end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

FIX = [sys.executable, "-m", "gradguard", "fix", "--apply"]


def _fix(tmp_path, source: str, *extra: str) -> tuple[subprocess.CompletedProcess, str]:
    script = tmp_path / "repro.py"
    script.write_text(textwrap.dedent(source).lstrip())
    run = subprocess.run([*FIX, *extra, "repro.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    return run, script.read_text()


def _runs_clean(tmp_path) -> None:
    plain = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip().startswith("ok"), plain.stdout


# torchaudio's Griffin-Lim: the phase estimate divided in place, the result assigned back (and a momentum term
# scaled in place inside an expression), while the product that read it is saved for backward.
GRIFFIN_LIM = """
    import torch

    torch.manual_seed(0)
    spec = torch.rand(5, 8, requires_grad=True)
    angles = torch.randn(5, 8)
    tprev = torch.zeros(5, 8)
    for _ in range(2):
        rebuilt = spec * angles
        angles = rebuilt - tprev.mul_(0.5)
        angles = angles.div_(angles.abs().add(1e-16))
        tprev = rebuilt
    loss = (angles * spec).sum()
    loss.backward()
    print("ok", round(spec.grad.sum().item(), 4))
"""


# exhaustive: tests/fast/test_repair_search.py derives this repair: the out-of-place table (`angles = angles.div_(n)`
# -> `angles = angles.div(n)`, `out = a - t.mul_(k)`) and the candidates from the write (inplace_to_out_of_place)
@pytest.mark.exhaustive
def test_griffin_lim_division_assigned_back_is_written_out_of_place(tmp_path):
    run, edited = _fix(tmp_path, GRIFFIN_LIM)
    assert run.returncode == 0, run.stderr
    assert "    angles = angles.div(angles.abs().add(1e-16))\n" in edited
    assert "div_" not in edited
    _runs_clean(tmp_path)


# HGCN: embeddings renormalised in place, and the renormed tensor returned from a helper.
HGCN = """
    import torch
    import torch.nn as nn


    def project(embeddings):
        return embeddings.renorm_(2, 0, 1.0)


    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(6, 4))
    embeddings = torch.tanh(w @ torch.randn(4, 4))
    loss = project(embeddings).pow(2).sum()
    loss.backward()
    print("ok")
"""


# exhaustive: tests/fast/test_repair_search.py::test_the_out_of_place_table_comes_from_the_tensor_type derives
# this edit (`return e.renorm_(2, 0, 1.0)` -> `e = e.renorm(2, 0, 1.0); return e`)
@pytest.mark.exhaustive
def test_hgcn_renorm_returned_from_a_helper_is_hoisted_out_of_place(tmp_path):
    run, edited = _fix(tmp_path, HGCN)
    assert run.returncode == 0, run.stderr
    assert "    embeddings = embeddings.renorm(2, 0, 1.0)\n    return embeddings\n" in edited
    _runs_clean(tmp_path)


# A Dropout switched to in-place after it was built, right after a ReLU that saves its output.
DROPOUT_SWITCHED = """
    import torch
    import torch.nn as nn


    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.act = nn.ReLU()
            self.drop = nn.Dropout(0.5)
            self.out = nn.Linear(8, 1)
            self.drop.inplace = True

        def forward(self, x):
            return self.out(self.drop(self.act(self.fc(x))))


    torch.manual_seed(0)
    head = Head()
    head(torch.randn(4, 8)).sum().backward()
    print("ok")
"""


# exhaustive: tests/fast/test_rule_inplace_set_later.py::test_gradguard_fix_apply_deletes_the_switch runs
# `gradguard fix --apply` on the same shape (the switch statement removed) and its JSON intents
@pytest.mark.exhaustive
def test_dropout_made_in_place_after_construction_loses_the_switch(tmp_path):
    run, edited = _fix(tmp_path, DROPOUT_SWITCHED, "--json", "fix.json")
    assert run.returncode == 0, run.stderr
    assert "self.drop.inplace = True" not in edited
    assert "self.drop = nn.Dropout(0.5)" in edited
    document = json.loads((tmp_path / "fix.json").read_text())
    assert [i["action"] for i in document["edits"][0]["intents"]] == ["remove_statement"]
    _runs_clean(tmp_path)


# `relu_` on one of the views `chunk` returns (autograd refuses the write outright).
CHUNK_RELU = """
    import torch

    torch.manual_seed(0)
    w = torch.randn(4, 8, requires_grad=True)
    h = torch.randn(3, 4) @ w
    a, b = h.chunk(2, dim=1)
    a.relu_()
    (a * b).sum().backward()
    print("ok")
"""


def test_relu_on_a_chunk_output_becomes_a_new_tensor(tmp_path):
    run, edited = _fix(tmp_path, CHUNK_RELU)
    assert run.returncode == 0, run.stderr
    assert "\na = a.relu()\n" in edited
    _runs_clean(tmp_path)


# `normal_` has no out-of-place method: the repair writes into a clone instead of calling `x.normal()`.
NORMAL = """
    import torch

    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.sigmoid(w)
    noise = x * 1.0
    x.normal_()
    (x * noise).sum().backward()
    print("ok")
"""


# exhaustive: tests/fast/test_repair_search.py::test_candidates_come_from_the_write_and_the_save_whatever_the_rule
# derives this repair (`y.normal_()`: no out-of-place method, `y = y.clone()` inserted before the write)
@pytest.mark.exhaustive
def test_normal_without_an_out_of_place_method_writes_into_a_clone(tmp_path):
    run, edited = _fix(tmp_path, NORMAL)
    assert run.returncode == 0, run.stderr
    assert "\nx = x.clone()\nx.normal_()\n" in edited
    assert "x.normal()" not in run.stdout + run.stderr
    _runs_clean(tmp_path)


# Two `nn.ReLU(inplace=True)` in the model; only the one after the Sigmoid (gate.2) overwrites a saved output.
SEQUENTIAL_TWO_RELUS = """
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True))
            self.gate = nn.Sequential(
                nn.Linear(8, 8),
                nn.Sigmoid(),
                nn.ReLU(inplace=True),
            )

        def forward(self, x):
            return self.gate(self.stem(x))


    torch.manual_seed(0)
    net = Net()
    net(torch.randn(2, 8)).sum().backward()
    print("ok")
"""


# exhaustive: tests/fast/test_repair_search.py::test_the_module_instance_that_wrote_is_resolved_from_its_path
# derives this repair on the same model (gate's ReLU set to inplace=False, the stem's left alone)
@pytest.mark.exhaustive
def test_the_writing_instance_of_two_in_place_relus_is_the_one_edited(tmp_path):
    run, edited = _fix(tmp_path, SEQUENTIAL_TWO_RELUS)
    assert run.returncode == 0, run.stderr
    assert "nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True))" in edited  # the stem's ReLU is fine
    assert "            nn.ReLU(inplace=False),\n" in edited
    assert "(2 runs)" in run.stderr  # the instance was resolved: one candidate, verified at once
    _runs_clean(tmp_path)


# The first hazard has a verified repair; the second one (in code gradguard may not edit) has none. One finding's
# signature going away is not the failure going away: nothing may be written.
SECOND_HAZARD_UNFIXABLE = """
    import torch

    w = torch.randn(3, requires_grad=True)
    a = torch.sigmoid(w)
    a.mul_(2)
    a.sum().backward()
    exec("b = torch.sigmoid(w)\\nb.mul_(2)\\nb.sum().backward()")
    print("ok")
"""


def test_an_edit_that_leaves_the_script_failing_is_not_written(tmp_path):
    run, edited = _fix(tmp_path, SECOND_HAZARD_UNFIXABLE)
    assert run.returncode == 1, run.stderr
    assert edited == textwrap.dedent(SECOND_HAZARD_UNFIXABLE).lstrip()
    assert "not kept" in run.stderr and "a = a.mul(2)" in run.stderr
    assert "applied to" not in run.stderr


# Co-training two networks on each other's predictions (mutual learning, co-teaching): both outputs are made
# first, each loss reads its peer's output undetached, so the first backward frees the peer's graph. The crossing
# tensor lives in a dict, not in a variable of its own: the detach goes where a call reads it.
PEER_OUTPUTS = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    nets = {"a": nn.Linear(6, 3), "b": nn.Linear(6, 3)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in nets.items()}
    for step in range(2):
        x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
        preds = {}
        for k, net in nets.items():
            preds[k] = net(x)
        for k, peer in (("a", "b"), ("b", "a")):
            agree = F.mse_loss(F.softmax(preds[k], 1), F.softmax(preds[peer], 1))
            loss = F.cross_entropy(preds[k], y) + agree
            opts[k].zero_grad()
            loss.backward()
            opts[k].step()
    print("ok", round(loss.item(), 4))
"""


def test_a_peer_output_read_by_the_earlier_loss_is_detached_where_it_is_read(tmp_path):
    run, edited = _fix(tmp_path, PEER_OUTPUTS)
    assert run.returncode == 0, run.stderr
    assert "F.mse_loss(F.softmax(preds[k], 1), F.softmax(preds[peer].detach(), 1))" in edited
    assert edited.count(".detach()") == 1
    _runs_clean(tmp_path)


# An adversarial autoencoder: the encoder learns to fool the critic, then the critic learns on the same codes,
# not detached; the encoder's backward freed the path the critic's loss reaches through them. Detaching the codes
# where they are made, or where the encoder's loss reads them, would cut the encoder's own gradient: the critic's
# read is the one to detach (the window of reads reaches the failing backward, not only the one that freed it).
ADVERSARIAL_CODES = """
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    critic = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
    opt_enc = torch.optim.SGD(encoder.parameters(), lr=0.01)
    opt_critic = torch.optim.SGD(critic.parameters(), lr=0.01)
    for step in range(2):
        codes = encoder(torch.randn(16, 6))
        prior = torch.randn(16, 2)
        fool_loss = -critic(codes).mean()
        opt_enc.zero_grad()
        fool_loss.backward()
        opt_enc.step()
        critic_loss = critic(codes).mean() - critic(prior).mean()
        opt_critic.zero_grad()
        critic_loss.backward()
        opt_critic.step()
    print("ok", round(critic_loss.item(), 4))
"""


def test_codes_the_later_loss_reads_through_a_freed_graph_are_detached_where_it_reads_them(tmp_path):
    run, edited = _fix(tmp_path, ADVERSARIAL_CODES)
    assert run.returncode == 0, run.stderr
    assert "    critic_loss = critic(codes.detach()).mean() - critic(prior).mean()\n" in edited
    assert edited.count(".detach()") == 1
    _runs_clean(tmp_path)


# Two optimizers stepping one model between two backwards of one loss, each step written on one line with `;`:
# the later backward is the second statement of its line, and the fresh forward goes after the first step's line.
TWO_STEPS_ONE_LINE = """
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    fast = torch.optim.SGD(net.parameters(), lr=1e-2)
    slow = torch.optim.SGD(net.parameters(), lr=1e-4)
    x = torch.randn(6, 3)
    pred = net(x)
    loss = pred.pow(2).mean()
    fast.zero_grad(); loss.backward(retain_graph=True); fast.step()
    slow.zero_grad(); loss.backward(); slow.step()
    print("ok", round(loss.item(), 4))
"""


def test_a_fresh_forward_follows_a_step_written_on_one_line_with_its_backward(tmp_path):
    run, edited = _fix(tmp_path, TWO_STEPS_ONE_LINE)
    assert run.returncode == 0, run.stderr
    assert ("fast.zero_grad(); loss.backward(retain_graph=True); fast.step()\n"
            "pred = net(x)\nloss = pred.pow(2).mean()\nslow.zero_grad()") in edited
    _runs_clean(tmp_path)


# A multi-agent update (MADDPG's shape): every agent's action made once, in a list, before the loop; each agent's
# `learn` backpropagates a loss through all actions and steps its own actor, which changes weights the next
# agent's backward still needs. The step already follows its backward, so moving it cannot help: the list is made
# again in the loop, found in the caller's frame (the loop is there, not in `learn`).
AGENTS_IN_A_LOOP = """
    import torch
    import torch.nn as nn

    torch.manual_seed(0)


    class Agent:
        def __init__(self):
            self.actor = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
            self.critic = nn.Linear(18, 1)
            self.opt = torch.optim.SGD(self.actor.parameters(), lr=0.1)

        def learn(self, obs, actions):
            loss = -self.critic(torch.cat(obs + actions, dim=1)).mean()
            self.opt.zero_grad()
            loss.backward(retain_graph=True)
            self.opt.step()
            return loss.item()


    agents = [Agent() for _ in range(3)]
    obs = [torch.randn(5, 4) for _ in range(3)]
    actions = [agent.actor(o) for agent, o in zip(agents, obs)]
    for agent in agents:
        loss = agent.learn(obs, actions)
    print("ok", round(loss, 4))
"""


def test_a_list_made_before_the_loop_that_steps_is_made_again_in_it(tmp_path):
    run, edited = _fix(tmp_path, AGENTS_IN_A_LOOP)
    assert run.returncode == 0, run.stderr
    assert ("for agent in agents:\n    actions = [agent.actor(o) for agent, o in zip(agents, obs)]\n"
            "    loss = agent.learn(obs, actions)\n") in edited
    _runs_clean(tmp_path)


# Two losses of one forward (an adversarial term and a diversity term on the same discriminator features),
# backpropagated in turn with no step between: the first backward frees the graph the second still needs. A
# detach would drop one of the two gradients; retain_graph=True on the first keeps both.
TWO_LOSSES_ONE_FORWARD = """
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))
    D = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
    fake = G(torch.randn(16, 4))
    phi_fake = D(fake)
    adv_loss = -phi_fake.mean()
    adv_loss.backward()
    div_loss = -phi_fake.var(dim=0).mean()
    div_loss.backward()
    print("ok", round(adv_loss.item(), 4), round(div_loss.item(), 4))
"""


# exhaustive: tests/fast/test_repair_search.py::
# test_an_earlier_backward_of_another_loss_on_the_same_forward_retains_its_graph derives this repair (retain_graph=True
# on the first backward, ranked before a detach)
@pytest.mark.exhaustive
def test_an_earlier_backward_sharing_the_forward_of_a_later_loss_retains_its_graph(tmp_path):
    run, edited = _fix(tmp_path, TWO_LOSSES_ONE_FORWARD)
    assert run.returncode == 0, run.stderr
    assert "adv_loss.backward(retain_graph=True)\n" in edited
    assert "detach" not in edited
    _runs_clean(tmp_path)


# A recurrent state kept in a dict across steps (`state["h"]`): the finding names it by its runtime key
# (`state['h']`), the source spells it with other quotes; the detach goes where the next step feeds it back in.
DICT_STATE = """
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    rnn = nn.GRUCell(4, 8)
    opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
    state = {"h": torch.zeros(2, 8)}
    for step in range(3):
        state["h"] = rnn(torch.randn(2, 4), state["h"])
        loss = state["h"].pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("ok", round(loss.item(), 4))
"""


def test_a_state_kept_in_a_dict_is_detached_where_the_next_step_feeds_it_back(tmp_path):
    run, edited = _fix(tmp_path, DICT_STATE)
    assert run.returncode == 0, run.stderr
    assert '    state["h"] = rnn(torch.randn(2, 4), state["h"].detach())\n' in edited
    _runs_clean(tmp_path)


# A snapshot taken under no_grad as a view (`first = x[0]`), its base then written with grad mode on: PyTorch refuses
# at the first read of the view, not at the write; the copy is made where the view was.
NO_GRAD_SNAPSHOT = """
    import torch

    torch.manual_seed(0)
    w = torch.randn(3, 4, requires_grad=True)
    x = w * 2
    with torch.no_grad():
        first = x[0]
    x.mul_(3)
    loss = (first * w[0]).sum() + x.sum()
    loss.backward()
    print("ok", round(w.grad.sum().item(), 4))
"""


# exhaustive: tests/fast/test_eager_errors.py::test_view_created_under_no_grad_read_after_its_base_was_written
# derives this repair (the clone_assignment intent at the view's line)
@pytest.mark.exhaustive
def test_a_no_grad_view_read_after_its_base_was_written_is_made_a_copy(tmp_path):
    run, edited = _fix(tmp_path, NO_GRAD_SNAPSHOT)
    assert run.returncode == 0, run.stderr
    assert "    first = x[0].clone()\n" in edited
    _runs_clean(tmp_path)


# A memory bank filled by a helper (`bank.append(z)`), read by every later loss: each stored item still holds the
# graph of the step that made it. The detach goes where items enter the bank, which keeps this step's own path.
MEMORY_BANK = """
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    enc = nn.Linear(4, 4)
    opt = torch.optim.SGD(enc.parameters(), lr=0.1)
    bank = []

    def remember(z):
        bank.append(z)

    for step in range(3):
        z = enc(torch.randn(2, 4))
        remember(z)
        loss = (z - torch.stack(bank).mean(0)).pow(2).mean() + z.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("ok", round(enc.weight.sum().item(), 5))
"""


def test_an_item_kept_in_a_memory_bank_is_detached_where_it_enters_the_bank(tmp_path):
    run, edited = _fix(tmp_path, MEMORY_BANK)
    assert run.returncode == 0, run.stderr
    assert "    bank.append(z.detach())\n" in edited
    _runs_clean(tmp_path)


# A projection of a parameter cached on the first call (`if self._cache is None:`): the next step backpropagates
# into the first step's freed graph. Detaching the cache would stop `proj` and `anchor` from learning (verification
# refuses it); the cache made in every call is the repair.
LAZY_CACHE = """
    import torch
    import torch.nn as nn

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.anchor = nn.Parameter(torch.randn(1, 4))
            self._cache = None

        def forward(self, x):
            if self._cache is None:
                self._cache = self.proj(self.anchor)
            return x @ self._cache.t()

    torch.manual_seed(0)
    head = Head()
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    for step in range(3):
        loss = head(torch.randn(2, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("ok", round(head.proj.weight.sum().item(), 5))
"""


# exhaustive: tests/fast/test_backward_twice_mechanism.py::
# test_state_made_only_while_a_test_of_it_holds_is_made_every_time_as_an_alternative derives the intent and
# tests/fast/test_fix_edits.py::test_run_unconditionally_replaces_the_if_by_its_body the edit
@pytest.mark.exhaustive
def test_a_cache_made_once_from_trained_parameters_is_made_in_every_call(tmp_path):
    run, edited = _fix(tmp_path, LAZY_CACHE)
    assert run.returncode == 0, run.stderr
    assert "if self._cache is None" not in edited
    assert "\n        self._cache = self.proj(self.anchor)\n        return x @ self._cache.t()\n" in edited
    _runs_clean(tmp_path)


# fairseq's encoder output: the tanh output (saved as its result) is returned in a tuple and written column by
# column as `encoder_out[0][:, :, j]` in the decoder; a tuple has no clone, so the copy goes where tanh's output is
# bound.
TUPLE_OUTPUT = """
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    proj = nn.Linear(4, 6)

    def encode(x):
        h = torch.tanh(proj(x))
        return (h, x.new_zeros(x.shape[:2]))

    encoder_out = encode(torch.randn(2, 5, 4))
    for j in range(6):
        encoder_out[0][:, :, j] = encoder_out[0][:, :, j] * 0.5
    encoder_out[0].sum().backward()
    print("ok", round(proj.weight.grad.sum().item(), 5))
"""


# exhaustive: tests/fast/test_repair_search.py::
# test_an_output_saved_by_its_op_is_copied_where_it_is_bound_whatever_the_write_calls_it derives this repair
@pytest.mark.exhaustive
def test_an_output_written_through_a_tuple_is_copied_where_its_op_binds_it(tmp_path):
    run, edited = _fix(tmp_path, TUPLE_OUTPUT)
    assert run.returncode == 0, run.stderr
    assert "    h = torch.tanh(proj(x)).clone()\n" in edited
    _runs_clean(tmp_path)


# The beginner's running loss: `total_loss += loss` and `total_loss.backward()` in every step. The second step's
# backward runs into the first step's freed graph (and would count its loss twice): each step backpropagates its
# own loss and the total keeps only values.
RUNNING_LOSS = """
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    total_loss = 0
    for i in range(3):
        loss = net(torch.randn(4, 3)).pow(2).mean()
        total_loss += loss
        opt.zero_grad()
        total_loss.backward()
        opt.step()
    print("ok", round(float(total_loss), 5), round(net.weight.sum().item(), 5))
"""


def test_a_running_loss_backpropagated_every_step_backpropagates_each_steps_loss(tmp_path):
    run, edited = _fix(tmp_path, RUNNING_LOSS)
    assert run.returncode == 0, run.stderr
    assert "    total_loss += loss.detach()\n" in edited and "    loss.backward()\n" in edited
    _runs_clean(tmp_path)


# A physics-informed net's second derivative: the first `torch.autograd.grad` keeps the graph (retain_graph=True)
# but does not record the gradient (no create_graph), so differentiating `u_x` again finds no graph ("element 0 of
# tensors does not require grad"). The keyword goes on the call that made `u_x`.
PINN = """
    import math
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.linspace(0, 1, 6).view(-1, 1).requires_grad_(True)

    def residual(x):
        u = net(x)
        u_x = torch.autograd.grad(u, x, torch.ones_like(u), retain_graph=True)[0]
        u_xx = torch.autograd.grad(u_x, x, torch.ones_like(u_x), create_graph=True)[0]
        return u_xx + math.pi ** 2 * torch.sin(math.pi * x)

    for it in range(2):
        loss = residual(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("ok", round(loss.item(), 5))
"""


def test_a_second_derivative_of_a_gradient_taken_without_create_graph_gets_it(tmp_path):
    run, edited = _fix(tmp_path, PINN)
    assert run.returncode == 0, run.stderr
    assert "u_x = torch.autograd.grad(u, x, torch.ones_like(u), retain_graph=True, create_graph=True)[0]" in edited
    _runs_clean(tmp_path)


# REINFORCE as pytorch/examples writes it, without the `del ...[:]` that empties the episode's buffers: the next
# episode's loss runs through the earlier episodes' log-probabilities. Detached where they enter, nothing trains
# (verification refuses it); both buffers emptied after the block of the backward (NOTE [Buffers filled in step]).
REINFORCE = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributions import Categorical

    torch.manual_seed(0)

    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.affine1 = nn.Linear(4, 16)
            self.affine2 = nn.Linear(16, 2)
            self.saved_log_probs = []
            self.rewards = []

        def forward(self, x):
            return F.softmax(self.affine2(F.relu(self.affine1(x))), dim=1)

    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def select_action(state):
        m = Categorical(policy(state.unsqueeze(0)))
        action = m.sample()
        policy.saved_log_probs.append(m.log_prob(action))
        return action.item()

    def finish_episode():
        R, policy_loss, returns = 0, [], []
        for r in policy.rewards[::-1]:
            R = r + 0.99 * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        for log_prob, R in zip(policy.saved_log_probs, returns):
            policy_loss.append(-log_prob * R)
        optimizer.zero_grad()
        policy_loss = torch.cat(policy_loss).sum()
        policy_loss.backward()
        optimizer.step()

    for episode in range(3):
        for t in range(4):
            policy.rewards.append(float(select_action(torch.randn(4))))
        finish_episode()
    print("ok", round(sum(p.sum().item() for p in policy.parameters()), 5))
"""


def test_episode_buffers_kept_across_episodes_are_emptied_after_the_backward(tmp_path):
    run, edited = _fix(tmp_path, REINFORCE)
    assert run.returncode == 0, run.stderr
    assert "    optimizer.step()\n    policy.saved_log_probs.clear()\n    policy.rewards.clear()\n" in edited
    _runs_clean(tmp_path)


# PGD whose step turns the adversarial example into a computed tensor: from the second step on, `x_adv.grad` is
# None ("'NoneType' object has no attribute 'sign'"). Keeping its gradient (retain_grad) runs into the freed graph
# of the earlier steps; made a leaf where it is made, each step has its own.
PGD = """
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    x_adv = x.clone().requires_grad_(True)
    for _ in range(3):
        loss = F.cross_entropy(model(x_adv), y)
        loss.backward()
        x_adv = x_adv + 0.01 * x_adv.grad.sign()
        x_adv = torch.min(torch.max(x_adv, x - 0.1), x + 0.1)
    print("ok", round(F.cross_entropy(model(x_adv), y).item(), 5))
"""


def test_an_attack_step_that_reads_the_gradient_of_a_computed_tensor_makes_it_a_leaf(tmp_path):
    run, edited = _fix(tmp_path, PGD)
    assert run.returncode == 0, run.stderr
    assert "    x_adv = (torch.min(torch.max(x_adv, x - 0.1), x + 0.1)).detach().requires_grad_()\n" in edited
    _runs_clean(tmp_path)
