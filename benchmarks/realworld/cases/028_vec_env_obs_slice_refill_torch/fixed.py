# Reproduction of the rollout loop in https://github.com/hill-a/stable-baselines/issues/550 (ppo2.py Runner.run),
# written with a torch observation buffer and a learner that backpropagates after the rollout.
import torch
from torch import nn

torch.manual_seed(0)


class Env:
    def step(self, actions):
        obs = torch.randn(2, 4)
        rewards = (actions == 1).float()
        return obs, rewards, torch.zeros(2, dtype=torch.bool), [{}, {}]


class Runner:
    def __init__(self, env, model, n_steps=3):
        self.env, self.model, self.n_steps = env, model, n_steps
        self.obs = torch.randn(2, 4)
        self.dones = torch.zeros(2, dtype=torch.bool)

    def run(self):
        mb_logprobs, mb_rewards = [], []
        for _ in range(self.n_steps):
            dist = torch.distributions.Categorical(logits=self.model(self.obs))
            actions = dist.sample()
            mb_logprobs.append(dist.log_prob(actions))
            self.obs, rewards, self.dones, infos = self.env.step(actions)
            mb_rewards.append(rewards)
        return torch.stack(mb_logprobs), torch.stack(mb_rewards)


model = nn.Linear(4, 2)
runner = Runner(Env(), model)
logprobs, rewards = runner.run()
loss = -(logprobs * rewards).mean()
loss.backward()
print(loss.item())
