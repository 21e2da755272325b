# Reproduction of https://github.com/thu-ml/tianshou/issues/37 (tianshou/policy/modelfree/sac.py learn() before the
# torch 1.5 compatibility fix: the actor's loss is formed through both critics before their optimizer steps).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Critic(nn.Module):
    def __init__(self, state_dim, action_dim, hidden=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(state_dim + action_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, s, a):
        return self.net(torch.cat([s, a], dim=1))


class Actor(nn.Module):
    def __init__(self, state_dim, action_dim, hidden=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(state_dim, hidden), nn.ReLU(), nn.Linear(hidden, 2 * action_dim))

    def forward(self, s):
        mu, log_sigma = self.net(s).chunk(2, dim=1)
        dist = torch.distributions.Normal(mu, log_sigma.clamp(-20, 2).exp())
        x = dist.rsample()
        act = torch.tanh(x)
        log_prob = (dist.log_prob(x) - torch.log(1 - act.pow(2) + 1e-6)).sum(1, keepdim=True)
        return act, log_prob


class SACPolicy:
    def __init__(self, actor, critic1, critic2, alpha=0.2, gamma=0.99):
        self.actor, self.critic1, self.critic2 = actor, critic1, critic2
        self.actor_optim = torch.optim.Adam(actor.parameters(), lr=1e-3)
        self.critic1_optim = torch.optim.Adam(critic1.parameters(), lr=1e-3)
        self.critic2_optim = torch.optim.Adam(critic2.parameters(), lr=1e-3)
        self._alpha, self._gamma = alpha, gamma

    def learn(self, obs, act, rew, obs_next, done):
        with torch.no_grad():
            a_, log_prob_ = self.actor(obs_next)
            target_q = torch.min(self.critic1(obs_next, a_), self.critic2(obs_next, a_)) - self._alpha * log_prob_
            target_q = rew + (1. - done) * self._gamma * target_q
        # critic 1
        current_q1 = self.critic1(obs, act)
        critic1_loss = F.mse_loss(current_q1, target_q)
        # critic 2
        current_q2 = self.critic2(obs, act)
        critic2_loss = F.mse_loss(current_q2, target_q)
        self.critic1_optim.zero_grad()
        critic1_loss.backward()
        self.critic1_optim.step()
        self.critic2_optim.zero_grad()
        critic2_loss.backward()
        self.critic2_optim.step()
        # actor
        a, log_prob = self.actor(obs)
        current_q1a = self.critic1(obs, a)
        current_q2a = self.critic2(obs, a)
        actor_loss = (self._alpha * log_prob - torch.min(current_q1a, current_q2a)).mean()
        self.actor_optim.zero_grad()
        actor_loss.backward()
        self.actor_optim.step()
        return actor_loss.item(), critic1_loss.item(), critic2_loss.item()


policy = SACPolicy(Actor(3, 1), Critic(3, 1), Critic(3, 1))
obs, act, rew = torch.randn(16, 3), torch.rand(16, 1) * 2 - 1, torch.randn(16, 1)
obs_next, done = torch.randn(16, 3), torch.zeros(16, 1)
print(policy.learn(obs, act, rew, obs_next, done))
