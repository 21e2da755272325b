# Correct program: the update() of https://github.com/openai/spinningup/blob/master/spinup/algos/pytorch/sac/sac.py (shrunk).
import itertools
from copy import deepcopy
import torch
import torch.nn as nn

torch.manual_seed(0)
obs_dim, act_dim, gamma, alpha, polyak = 3, 2, 0.99, 0.2, 0.995
q1 = nn.Sequential(nn.Linear(obs_dim + act_dim, 16), nn.ReLU(), nn.Linear(16, 1))
q2 = nn.Sequential(nn.Linear(obs_dim + act_dim, 16), nn.ReLU(), nn.Linear(16, 1))
pi = nn.Sequential(nn.Linear(obs_dim, 16), nn.ReLU(), nn.Linear(16, act_dim), nn.Tanh())
q1_targ, q2_targ = deepcopy(q1), deepcopy(q2)
for p in itertools.chain(q1_targ.parameters(), q2_targ.parameters()):
    p.requires_grad = False
q_params = itertools.chain(q1.parameters(), q2.parameters())
q_optimizer = torch.optim.Adam(q_params, lr=1e-3)
pi_optimizer = torch.optim.Adam(pi.parameters(), lr=1e-3)


def compute_loss_q(o, a, r, o2, d):
    q1v = q1(torch.cat([o, a], -1))
    q2v = q2(torch.cat([o, a], -1))
    with torch.no_grad():
        a2 = pi(o2)
        q_pi_targ = torch.min(q1_targ(torch.cat([o2, a2], -1)), q2_targ(torch.cat([o2, a2], -1)))
        backup = r + gamma * (1 - d) * q_pi_targ
    return ((q1v - backup)**2).mean() + ((q2v - backup)**2).mean()


def compute_loss_pi(o):
    a = pi(o)
    q_pi = torch.min(q1(torch.cat([o, a], -1)), q2(torch.cat([o, a], -1)))
    return (alpha * a.pow(2).sum(-1, keepdim=True) - q_pi).mean()


for step in range(2):
    o, a, r, o2, d = torch.randn(6, obs_dim), torch.rand(6, act_dim), torch.randn(6, 1), torch.randn(6, obs_dim), torch.zeros(6, 1)
    q_optimizer.zero_grad()
    loss_q = compute_loss_q(o, a, r, o2, d)
    loss_q.backward()
    q_optimizer.step()
    for p in itertools.chain(q1.parameters(), q2.parameters()):
        p.requires_grad = False
    pi_optimizer.zero_grad()
    loss_pi = compute_loss_pi(o)
    loss_pi.backward()
    pi_optimizer.step()
    for p in itertools.chain(q1.parameters(), q2.parameters()):
        p.requires_grad = True
    with torch.no_grad():
        for p, p_targ in zip(itertools.chain(q1.parameters(), q2.parameters()),
                             itertools.chain(q1_targ.parameters(), q2_targ.parameters())):
            p_targ.data.mul_(polyak)
            p_targ.data.add_((1 - polyak) * p.data)
print(loss_pi.item())
