# Correct program: the rollout storage and update of https://github.com/vwxyzjn/cleanrl/blob/master/cleanrl/ppo.py (shrunk).
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

torch.manual_seed(0)
num_steps, num_envs, obs_dim, n_actions, gamma, gae_lambda, clip_coef = 4, 2, 3, 2, 0.99, 0.95, 0.2


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(obs_dim, 16), nn.Tanh(), nn.Linear(16, 1))
        self.actor = nn.Sequential(nn.Linear(obs_dim, 16), nn.Tanh(), nn.Linear(16, n_actions))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


agent = Agent()
optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
obs = torch.zeros((num_steps, num_envs, obs_dim))
actions = torch.zeros((num_steps, num_envs))
logprobs = torch.zeros((num_steps, num_envs))
rewards = torch.zeros((num_steps, num_envs))
dones = torch.zeros((num_steps, num_envs))
values = torch.zeros((num_steps, num_envs))
next_obs, next_done = torch.randn(num_envs, obs_dim), torch.zeros(num_envs)
for step in range(0, num_steps):
    obs[step] = next_obs
    dones[step] = next_done
    with torch.no_grad():
        action, logprob, _, value = agent.get_action_and_value(next_obs)
        values[step] = value.flatten()
    actions[step] = action
    logprobs[step] = logprob
    rewards[step] = torch.randn(num_envs)
    next_obs, next_done = torch.randn(num_envs, obs_dim), torch.zeros(num_envs)
with torch.no_grad():
    next_value = agent.get_value(next_obs).reshape(1, -1)
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal, nextvalues = 1.0 - next_done, next_value
        else:
            nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values
b_obs, b_logprobs, b_actions = obs.reshape(-1, obs_dim), logprobs.reshape(-1), actions.reshape(-1)
b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
for epoch in range(2):
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs, b_actions.long())
    ratio = (newlogprob - b_logprobs).exp()
    pg_loss = torch.max(-b_advantages * ratio, -b_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()
    v_loss = 0.5 * ((newvalue.view(-1) - b_returns) ** 2).mean()
    loss = pg_loss - 0.01 * entropy.mean() + v_loss * 0.5
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
    optimizer.step()
print(loss.item())
