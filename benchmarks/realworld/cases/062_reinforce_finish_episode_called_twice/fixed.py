# Reproduction of https://github.com/pytorch/examples/issues/151 (reinforcement_learning/reinforce.py; the reporter calls
# finish_episode() more than once per episode to sample experiences, so the saved log-probs are not cleared in between).
from collections import deque
import random
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

torch.manual_seed(543)
random.seed(543)
gamma = 0.99
eps = np.finfo(np.float32).eps.item()


class Policy(nn.Module):
    def __init__(self):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(4, 16)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(16, 2)
        self.saved_log_probs = []
        self.rewards = []
        self.saved_steps = []

    def forward(self, x):
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


policy = Policy()
optimizer = optim.Adam(policy.parameters(), lr=1e-2)


def select_action(state):
    state = torch.from_numpy(state).float().unsqueeze(0)
    probs = policy(state)
    m = Categorical(probs)
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))
    policy.saved_steps.append((state, action))
    return action.item()


def finish_episode(indices):
    R = 0
    policy_loss = []
    returns = deque()
    for r in policy.rewards[::-1]:
        R = r + gamma * R
        returns.appendleft(R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    for i in indices:
        state_i, action_i = policy.saved_steps[i]
        policy_loss.append(-Categorical(policy(state_i)).log_prob(action_i) * returns[i])
    optimizer.zero_grad()
    policy_loss = torch.cat(policy_loss).sum()
    policy_loss.backward()
    optimizer.step()


rng = np.random.default_rng(0)
state = rng.standard_normal(4).astype(np.float32)
for t in range(6):
    action = select_action(state)
    state, reward = rng.standard_normal(4).astype(np.float32), float(action)
    policy.rewards.append(reward)
for _ in range(2):
    finish_episode(random.sample(range(len(policy.rewards)), 4))
del policy.rewards[:]
del policy.saved_log_probs[:]
print("episode done")
