# Reproduction of https://github.com/vietnh1009/Super-mario-bros-PPO-pytorch/issues/5 (train.py; "why detach?"): the update
# loop with `old_log_policies = torch.cat(old_log_policies)` instead of `torch.cat(old_log_policies).detach()`.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

torch.manual_seed(0)
num_local_steps, num_processes, num_epochs, batch_size = 4, 2, 2, 2
gamma, tau, epsilon, beta = 0.9, 1.0, 0.2, 0.01


class PPO(nn.Module):
    def __init__(self, num_inputs, num_actions):
        super(PPO, self).__init__()
        self.linear = nn.Linear(num_inputs, 16)
        self.critic_linear = nn.Linear(16, 1)
        self.actor_linear = nn.Linear(16, num_actions)

    def forward(self, x):
        x = F.relu(self.linear(x))
        return self.actor_linear(x), self.critic_linear(x)


model = PPO(6, 3)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
curr_states = torch.randn(num_processes, 6)
old_log_policies, actions, values, states, rewards, dones = [], [], [], [], [], []
for _ in range(num_local_steps):
    states.append(curr_states)
    logits, value = model(curr_states)
    values.append(value.squeeze())
    policy = F.softmax(logits, dim=1)
    old_m = Categorical(policy)
    action = old_m.sample()
    actions.append(action)
    old_log_policy = old_m.log_prob(action)
    old_log_policies.append(old_log_policy)
    rewards.append(torch.randn(num_processes))
    dones.append(torch.zeros(num_processes))
    curr_states = torch.randn(num_processes, 6)
_, next_value, = model(curr_states)
next_value = next_value.squeeze()
old_log_policies = torch.cat(old_log_policies).detach()
actions = torch.cat(actions)
values = torch.cat(values).detach()
states = torch.cat(states)
gae = 0
R = []
for value, reward, done in list(zip(values.view(num_local_steps, num_processes), rewards, dones))[::-1]:
    gae = gae * gamma * tau
    gae = gae + reward + gamma * next_value.detach() * (1 - done) - value.detach()
    next_value = value
    R.append(gae + value)
R = R[::-1]
R = torch.cat(R).detach()
advantages = R - values
for i in range(num_epochs):
    indice = torch.randperm(num_local_steps * num_processes)
    for j in range(batch_size):
        batch_indices = indice[int(j * (num_local_steps * num_processes / batch_size)): int((j + 1) * (num_local_steps * num_processes / batch_size))]
        logits, value = model(states[batch_indices])
        new_policy = F.softmax(logits, dim=1)
        new_m = Categorical(new_policy)
        new_log_policy = new_m.log_prob(actions[batch_indices])
        ratio = torch.exp(new_log_policy - old_log_policies[batch_indices])
        actor_loss = -torch.mean(torch.min(ratio * advantages[batch_indices],
                                           torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantages[batch_indices]))
        critic_loss = F.smooth_l1_loss(R[batch_indices], value.squeeze())
        entropy_loss = torch.mean(new_m.entropy())
        total_loss = actor_loss + critic_loss - beta * entropy_loss
        optimizer.zero_grad()
        total_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
print(total_loss.item())
