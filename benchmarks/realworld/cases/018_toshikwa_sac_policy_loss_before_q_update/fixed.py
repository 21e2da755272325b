# Reproduction of https://github.com/toshikwa/soft-actor-critic.pytorch/issues/1 (sacd agent learn(): loss order).
import torch
import torch.nn as nn

torch.manual_seed(0)


def update_params(optim, network, loss, grad_clip=None, retain_graph=False):
    optim.zero_grad()
    loss.backward(retain_graph=retain_graph)
    if grad_clip is not None:
        for p in network.modules():
            torch.nn.utils.clip_grad_norm_(p.parameters(), grad_clip)
    optim.step()


class QNetwork(nn.Module):
    def __init__(self, num_inputs, num_actions):
        super().__init__()
        self.Q = nn.Sequential(nn.Linear(num_inputs + num_actions, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.Q(x)


class TwinnedQNetwork(nn.Module):
    def __init__(self, num_inputs, num_actions):
        super().__init__()
        self.Q1 = QNetwork(num_inputs, num_actions)
        self.Q2 = QNetwork(num_inputs, num_actions)

    def forward(self, states, actions):
        x = torch.cat([states, actions], dim=1)
        return self.Q1(x), self.Q2(x)


class GaussianPolicy(nn.Module):
    def __init__(self, num_inputs, num_actions):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_inputs, 16), nn.ReLU(), nn.Linear(16, 2 * num_actions))

    def sample(self, states):
        mean, log_std = self.net(states).chunk(2, dim=-1)
        normal = torch.distributions.Normal(mean, log_std.clamp(-5, 2).exp())
        xs = normal.rsample()
        actions = torch.tanh(xs)
        log_probs = normal.log_prob(xs) - torch.log(1 - actions.pow(2) + 1e-6)
        return actions, -log_probs.sum(dim=1, keepdim=True)


class SacAgent:
    def __init__(self):
        self.policy = GaussianPolicy(3, 2)
        self.critic = TwinnedQNetwork(3, 2)
        self.q1_optim = torch.optim.Adam(self.critic.Q1.parameters(), lr=3e-4)
        self.q2_optim = torch.optim.Adam(self.critic.Q2.parameters(), lr=3e-4)
        self.policy_optim = torch.optim.Adam(self.policy.parameters(), lr=3e-4)
        self.alpha, self.gamma, self.grad_clip = 0.2, 0.99, None

    def calc_critic_loss(self, batch, weights):
        states, actions, rewards, next_states, dones = batch
        curr_q1, curr_q2 = self.critic(states, actions)
        with torch.no_grad():
            next_actions, next_entropies = self.policy.sample(next_states)
            next_q1, next_q2 = self.critic(next_states, next_actions)
            target_q = rewards + (1.0 - dones) * self.gamma * (torch.min(next_q1, next_q2) + self.alpha * next_entropies)
        q1_loss = torch.mean((curr_q1 - target_q).pow(2) * weights)
        q2_loss = torch.mean((curr_q2 - target_q).pow(2) * weights)
        return q1_loss, q2_loss, None, curr_q1.mean().item(), curr_q2.mean().item()

    def calc_policy_loss(self, batch, weights):
        states, actions, rewards, next_states, dones = batch
        sampled_action, entropy = self.policy.sample(states)
        q1, q2 = self.critic(states, sampled_action)
        q = torch.min(q1, q2)
        policy_loss = torch.mean((- q - self.alpha * entropy) * weights)
        return policy_loss, entropy

    def learn(self, batch, weights):
        q1_loss, q2_loss, errors, mean_q1, mean_q2 =\
            self.calc_critic_loss(batch, weights)

        update_params(
            self.q1_optim, self.critic.Q1, q1_loss, self.grad_clip)
        update_params(
            self.q2_optim, self.critic.Q2, q2_loss, self.grad_clip)
        policy_loss, entropies = self.calc_policy_loss(batch, weights)
        update_params(
            self.policy_optim, self.policy, policy_loss, self.grad_clip)
        return policy_loss.item()


agent = SacAgent()
batch = (torch.randn(6, 3), torch.rand(6, 2) * 2 - 1, torch.randn(6, 1), torch.randn(6, 3), torch.zeros(6, 1))
print(agent.learn(batch, torch.ones(6, 1)))
