"""Backward twice, found by walking the failing graph to the part an earlier backward freed: the tensor that
crosses is named whatever holds it (a module's state, a list element, a variable in an outer frame or an
object's attribute), with the line that made it, and the earlier backward is in ``modified_at`` (the JSON), not
only in the display text."""

from __future__ import annotations

import pytest

import gradguard


def _finding(tmp_path, code: str):
    script = tmp_path / "script.py"
    script.write_text(code)
    with pytest.raises(gradguard.BackwardTwiceError) as info:
        with gradguard.guard():
            exec(compile(code, str(script), "exec"), {"__name__": "__main__"})
    return info.value.finding, code.splitlines()


def _line(lines, code: str) -> int:
    return next(i for i, text in enumerate(lines, 1) if text.strip().startswith(code))


MODULE_STATE = '''\
import torch
import torch.nn as nn


class Neuron(nn.Module):
    def __init__(self):
        super().__init__()
        self.v = torch.zeros(1)

    def forward(self, x):
        self.v = 0.5 * self.v + x
        return torch.sigmoid(self.v)


net = nn.ModuleDict({"fc": nn.Linear(3, 3), "body": nn.Sequential(nn.Tanh(), Neuron())})
for step in range(2):
    loss = net["body"](net["fc"](torch.randn(2, 3))).sum()
    loss.backward()
'''


def test_state_kept_on_a_nested_module_is_named_with_its_assignment(tmp_path):
    finding, lines = _finding(tmp_path, MODULE_STATE)
    assert finding.kind == "backward_twice" and finding.rule == "freed_graph_reused"
    assert finding.tensor.name == "net.body.1.v"
    assert finding.saved_at.location.line == _line(lines, "self.v = 0.5 * self.v + x")
    assert [w.location.line for w in finding.modified_at] == [_line(lines, "loss.backward()")]
    assert finding.modified_at[0].category == "backward"
    assert finding.to_dict()["modified_at"][0]["line"] == _line(lines, "loss.backward()")
    assert "self.v = (0.5 * self.v + x).detach()" in finding.suggestion
    assert [f.action for f in finding.fixes] == ["detach_assignment"]


PEER_OUTPUTS = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F

models = [nn.Linear(4, 3), nn.Linear(4, 3)]
x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
outputs = []
for model in models:
    outputs.append(model(x))
for i in range(2):
    peer = outputs[1 - i]
    loss = F.cross_entropy(outputs[i], y) + F.kl_div(F.log_softmax(outputs[i], 1), F.softmax(peer, 1),
                                                     reduction="batchmean")
    loss.backward()
'''


def test_a_peer_models_output_in_a_list_is_named_by_its_element(tmp_path):
    finding, lines = _finding(tmp_path, PEER_OUTPUTS)
    # model 0's loss went through outputs[1] undetached, so its backward freed model 1's graph
    assert finding.tensor.name == "outputs[1]"
    assert finding.saved_at.location.line == _line(lines, "outputs.append(model(x))")
    assert [w.location.line for w in finding.modified_at] == [_line(lines, "loss.backward()")]


OUTER_FRAME = '''\
import torch
import torch.nn as nn


class Trainer:
    def __init__(self, model, data):
        self.model, self.data, self.opt = model, data, torch.optim.SGD(model.parameters(), lr=0.1)

    def train(self, steps):
        for step in range(steps):
            loss = self.model(self.data[step % 2]).pow(2).mean()
            loss.backward()
            self.opt.step()


to_input = nn.Linear(2, 3)
data = to_input(torch.randn(2, 4, 2))
Trainer(nn.Linear(3, 1), data).train(2)
'''


def test_a_tensor_made_in_an_outer_frame_is_named_by_its_variable(tmp_path):
    finding, lines = _finding(tmp_path, OUTER_FRAME)
    assert finding.tensor.name == "data"  # not the trainer's attribute: the variable the user assigned
    assert finding.saved_at.location.line == _line(lines, "data = to_input(")
    assert [w.location.line for w in finding.modified_at] == [_line(lines, "loss.backward()")]
    assert "data = to_input(torch.randn(2, 4, 2)).detach()" in finding.suggestion


# A table the forward derives from a weight is refined in the middle of the forward by its own backward and step
# (an in-place codebook optimiser), then looked up again; the encoder's output, older than that backward too, went
# into it detached and stays alive. NOTE [An old graph is not a freed one]: the crossing is the freed table's part,
# reached through the value made from it, not the encoder's.
REFINED_TABLE = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F

encoder = nn.Linear(4, 3)
weight = nn.Parameter(torch.randn(5, 3))
scale = nn.Parameter(torch.ones(3))
refine = torch.optim.SGD([weight], lr=0.1)


def lookup(z):
    table = weight * scale
    index = torch.cdist(z.detach(), table.detach()).argmin(-1)
    ((F.embedding(index, table) - z.detach()) ** 2).mean().backward()
    refine.step()
    return F.embedding(index, table)


z = encoder(torch.randn(6, 4))
out = {"z": z, "quantized": lookup(z)}
loss = (out["quantized"] - z).pow(2).mean() + out["z"].pow(2).mean()
loss.backward()
'''


def test_a_value_made_from_a_freed_table_is_named_not_an_older_live_graph(tmp_path):
    finding, lines = _finding(tmp_path, REFINED_TABLE)
    assert finding.tensor.name == "out['quantized']"  # not out['z']: the encoder's graph is old but alive
    assert finding.saved_at.location.line == _line(lines, "return F.embedding(index, table)")
    assert [w.location.line for w in finding.modified_at] == [_line(lines, "((F.embedding(index, table)")]


DICT_STATE = '''\
import torch
import torch.nn as nn

rnn = nn.GRUCell(4, 8)
state = {"h": torch.zeros(2, 8)}
for step in range(2):
    state["h"] = rnn(torch.randn(2, 4), state["h"])
    loss = state["h"].pow(2).mean()
    loss.backward()
'''


def test_state_kept_in_a_dict_is_made_where_its_item_is_assigned_not_where_the_dict_is(tmp_path):
    finding, lines = _finding(tmp_path, DICT_STATE)
    assert finding.rule == "freed_graph_reused" and finding.tensor.name == "state['h']"
    assert finding.facts.crossing.made.line == _line(lines, 'state["h"] = rnn')  # not `state = {...}`


TRAINER_STATE = '''\
import torch
import torch.nn as nn


class Trainer:
    def __init__(self):
        self.model = nn.LSTM(3, 6, batch_first=True)
        self.hidden = None

    def training_step(self, batch):
        out, self.hidden = self.model(batch, self.hidden)
        return out.pow(2).mean()

    def fit(self, steps):
        for _ in range(steps):
            loss = self.training_step(torch.randn(2, 5, 3))
            loss.backward()


Trainer().fit(2)
'''


def test_a_tuple_state_on_a_plain_object_is_made_where_its_class_assigns_it_and_detached_after(tmp_path):
    finding, lines = _finding(tmp_path, TRAINER_STATE)
    made = _line(lines, "out, self.hidden = self.model")
    assert finding.tensor.name == "self.hidden[0]"
    assert finding.facts.crossing.made.line == made and finding.facts.crossing.binding == "self.hidden"
    inserted = [x for x in finding.fixes if x.action == "insert_after"]
    assert [(x.line, x.detail["code"]) for x in inserted] == [
        (made, "self.hidden = tuple(h.detach() for h in self.hidden)")]


MEMORY_BANK = '''\
import collections
import torch
import torch.nn as nn

enc = nn.Linear(4, 4)
opt = torch.optim.SGD(enc.parameters(), lr=0.1)
bank = collections.deque(maxlen=3)


def remember(z):
    bank.append(z)


for step in range(3):
    z = enc(torch.randn(2, 4))
    remember(z)
    loss = (z - torch.stack(list(bank)).mean(0)).pow(2).mean() + z.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def test_an_item_of_a_deque_kept_across_steps_is_detached_where_it_enters(tmp_path):
    finding, lines = _finding(tmp_path, MEMORY_BANK)
    assert finding.rule == "freed_graph_reused"
    assert finding.tensor.name == "bank[0]"  # a deque's items are walked as a list's are
    enters = _line(lines, "bank.append(z)")
    assert f"detach each where it enters: `bank.append(z.detach())` (line {enters})" in finding.suggestion
    assert [(f.action, f.line, f.target, f.detail, f.preferred) for f in finding.fixes] == [
        ("detach_argument", enters, "z", {"call": "bank.append"}, True),
        # the alternative for a buffer of one episode (NOTE [Buffers filled in step]), after the block of the backward
        ("insert_after", _line(lines, "opt.step()"), "bank", {"code": "bank.clear()"}, False)]


# REINFORCE as pytorch/examples writes it, less the `del policy.rewards[:]` and `del policy.saved_log_probs[:]` at
# the end of finish_episode: the second episode's loss runs through the first episode's log-probabilities.
EPISODE_BUFFERS = '''\
import torch
import torch.nn as nn


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine = nn.Linear(4, 2)
        self.saved_log_probs = []
        self.rewards = []
        self.history = []


policy = Policy()
optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)


def select_action(state):
    m = torch.distributions.Categorical(logits=policy.affine(state))
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))
    return action.item()


def finish_episode():
    returns = torch.tensor(policy.rewards)
    log_probs = policy.saved_log_probs
    loss = -(torch.stack(log_probs) * returns).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    policy.history.append(loss.item())


for episode in range(2):
    for t in range(3):
        policy.rewards.append(float(select_action(torch.randn(4))))
    finish_episode()
'''


def test_buffers_filled_in_step_are_emptied_together_after_the_backward_that_used_them(tmp_path):
    finding, lines = _finding(tmp_path, EPISODE_BUFFERS)
    assert finding.rule == "freed_graph_reused"
    # reached through a local alias, spelt as the file fills it; `history` (one item per episode) is no buffer
    # of the step; the alias detached where it is made is the alternative (verification refuses it)
    after = _line(lines, "policy.history.append")
    assert [(f.action, f.line, f.target, f.detail, f.preferred) for f in finding.fixes] == [
        ("insert_after", after, "policy.saved_log_probs",
         {"code": "policy.saved_log_probs.clear()\npolicy.rewards.clear()"}, True),
        ("insert_after", _line(lines, "log_probs = "), "log_probs",
         {"code": "log_probs = tuple(h.detach() for h in log_probs)"}, False)]
    assert ("If `policy.saved_log_probs` collects one episode's items for one loss, empty it once that loss is "
            "backpropagated: `policy.saved_log_probs.clear()` (and `policy.rewards`, filled in step with it) insert "
            f"after line {after}.") in finding.suggestion


LAZY_CACHE = '''\
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


head = Head()
for step in range(2):
    loss = head(torch.randn(2, 4)).pow(2).mean()
    loss.backward()
'''


def test_state_made_only_while_a_test_of_it_holds_is_made_every_time_as_an_alternative(tmp_path):
    finding, lines = _finding(tmp_path, LAZY_CACHE)
    assert finding.rule == "freed_graph_reused"
    guard = _line(lines, "if self._cache is None:")
    assert (f"It is made only while `self._cache is None` (line {guard + 1} under line {guard}), then kept"
            in finding.suggestion)
    assert [(f.action, f.line, f.preferred) for f in finding.fixes] == [
        ("detach_assignment", guard + 1, True), ("run_unconditionally", guard, False)]
    assert finding.fixes[1].detail == {"test": "self._cache is None"}


RUNNING_SUM = '''\
import torch
import torch.nn as nn

net = nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
acc_loss = 0.0
for step in range(3):
    loss = net(torch.randn(4, 3)).pow(2).mean()
    acc_loss = acc_loss + loss
    scaler.scale(acc_loss).backward()
    scaler.step(opt)
    scaler.update()
'''


def test_a_running_sum_backpropagated_every_step_backpropagates_each_steps_loss_instead(tmp_path):
    finding, lines = _finding(tmp_path, RUNNING_SUM)
    assert finding.rule == "accumulated_loss_backpropagated"
    added, backward = _line(lines, "acc_loss = acc_loss + loss"), _line(lines, "scaler.scale(acc_loss)")
    assert finding.suggestion == (
        f"Backpropagate each step's own loss and keep only the value in the sum: `scaler.scale(loss).backward()` "
        f"(line {backward}) and `acc_loss = acc_loss + loss.detach()` (line {added}). The gradients are those of "
        f"each step's loss backpropagated once, as gradient accumulation means.")
    assert [(f.action, f.line, f.target, f.detail) for f in finding.fixes] == [
        ("replace_expression", backward, "acc_loss", {"with": "loss"}), ("detach_expression", added, "loss", {})]


HESSIAN_POWER_ITERATION = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F

model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
params = list(model.parameters())
loss = F.mse_loss(model(torch.randn(16, 5)), torch.randn(16, 1))
grads = torch.autograd.grad(loss, params, create_graph=True)
v = [torch.randn_like(p) for p in params]
for i in range(3):
    hv = torch.autograd.grad(grads, params, grad_outputs=v)
    v = [h.detach() for h in hv]
'''


def test_gradients_made_before_the_loop_that_backpropagates_them_are_made_in_it(tmp_path):
    # The create_graph=True call freed nothing: the earlier backward is the loop's own call, a step earlier.
    finding, lines = _finding(tmp_path, HESSIAN_POWER_ITERATION)
    loop_call = _line(lines, "hv = torch.autograd.grad(grads")
    assert finding.rule == "forward_outside_loop"
    assert finding.tensor.name == "grads[0]" and finding.tensor.shape == (8, 5)
    assert [w.location.line for w in finding.modified_at] == [loop_call]
    assert [(f.action, f.line) for f in finding.fixes] == [("insert_before", loop_call)]
    assert finding.fixes[0].detail["code"] == (
        "loss = F.mse_loss(model(torch.randn(16, 5)), torch.randn(16, 1))\n"
        "grads = torch.autograd.grad(loss, params, create_graph=True)")


STATES_BY_KEY = '''\
import torch
import torch.nn as nn

lstm = nn.LSTM(1, 4, batch_first=True)
opt = torch.optim.SGD(lstm.parameters(), lr=0.05)
streams = {"s0": torch.randn(1, 3, 1), "s1": torch.randn(1, 3, 1)}
state = {sid: None for sid in streams}
for chunk in range(2):
    for sid, x in streams.items():
        out, hidden = lstm(x, state[sid])
        state[sid] = hidden
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def test_a_state_kept_in_a_dict_by_a_computed_key_is_made_where_its_item_is_assigned(tmp_path):
    finding, lines = _finding(tmp_path, STATES_BY_KEY)
    assert finding.rule == "freed_graph_reused" and finding.tensor.name == "state['s0'][0]"
    item = _line(lines, "state[sid] = hidden")
    assert finding.saved_at.location.line == item
    assert [(f.action, f.line, f.detail) for f in finding.fixes] == [
        ("insert_after", item, {"code": "state[sid] = tuple(h.detach() for h in state[sid])"})]
