# Reproduction of the buffer reuse fixed in https://github.com/openai/baselines/pull/418 (DummyVecEnv returned self.buf_obs),
# with a PyTorch REINFORCE learner that wraps the observations with torch.as_tensor (shares memory with the numpy buffer).
import numpy as np
import torch
from torch import nn


class DummyVecEnv:
    def __init__(self, num_envs=2, obs_dim=4, seed=0):
        self.rng = np.random.default_rng(seed)
        self.buf_obs = np.zeros((num_envs, obs_dim), dtype=np.float32)

    def reset(self):
        self.buf_obs[:] = self.rng.standard_normal(self.buf_obs.shape)
        return self.buf_obs

    def step(self, actions):
        self.buf_obs[:] = self.rng.standard_normal(self.buf_obs.shape)
        rewards = (actions == 1).astype(np.float32)
        return self.buf_obs.copy(), rewards


torch.manual_seed(0)
policy = nn.Linear(4, 2)
optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
env = DummyVecEnv()
obs = env.reset()
log_probs, rewards = [], []
for t in range(3):
    logits = policy(torch.as_tensor(obs))
    dist = torch.distributions.Categorical(logits=logits)
    action = dist.sample()
    log_probs.append(dist.log_prob(action))
    obs, reward = env.step(action.numpy())
    rewards.append(torch.as_tensor(reward))
returns = torch.stack(rewards).flip(0).cumsum(0).flip(0)
loss = -(torch.stack(log_probs) * returns).mean()
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(policy.weight.grad.norm().item())
