# Reproduction of https://github.com/lweitkamp/option-critic-pytorch/issues/5 (main.py run loop; see also #4 and #9).
import torch
import torch.nn as nn
from torch.distributions import Categorical, Bernoulli

torch.manual_seed(0)


class OptionCriticFeatures(nn.Module):
    def __init__(self, in_features=4, num_actions=2, num_options=2):
        super().__init__()
        self.num_options = num_options
        self.features = nn.Sequential(nn.Linear(in_features, 32), nn.ReLU(), nn.Linear(32, 64), nn.ReLU())
        self.Q = nn.Linear(64, num_options)
        self.terminations = nn.Linear(64, num_options)
        self.options_W = nn.Parameter(torch.zeros(num_options, 64, num_actions))
        self.options_b = nn.Parameter(torch.zeros(num_options, num_actions))

    def get_state(self, obs):
        return self.features(obs)

    def get_Q(self, state):
        return self.Q(state)

    def predict_option_termination(self, state, current_option):
        termination = self.terminations(state)[:, current_option].sigmoid()
        option_termination = Bernoulli(termination).sample()
        next_option = self.get_Q(state).argmax(dim=-1)
        return bool(option_termination.item()), next_option.item()

    def get_action(self, state, option):
        logits = state @ self.options_W[option] + self.options_b[option]
        action_dist = Categorical(logits=logits.softmax(dim=-1))
        action = action_dist.sample()
        return action.item(), action_dist.log_prob(action), action_dist.entropy()


def actor_loss_fn(obs, option, logp, entropy, reward, done, next_obs, model, model_prime, gamma=0.99):
    state = model.get_state(obs)
    next_state = model.get_state(next_obs)
    next_state_prime = model_prime.get_state(next_obs)
    option_term_prob = model.terminations(state)[:, option].sigmoid()
    next_option_term_prob = model.terminations(next_state)[:, option].sigmoid().detach()
    Q = model.get_Q(state).detach().squeeze()
    next_Q_prime = model_prime.get_Q(next_state_prime).detach().squeeze()
    gt = reward + (1 - done) * gamma * ((1 - next_option_term_prob) * next_Q_prime[option] + next_option_term_prob * next_Q_prime.max(dim=-1)[0])
    termination_loss = option_term_prob * (Q[option].detach() - Q.max(dim=-1)[0].detach() + 0.01) * (1 - done)
    policy_loss = -logp * (gt.detach() - Q[option]) - 0.01 * entropy
    return termination_loss + policy_loss


option_critic = OptionCriticFeatures()
option_critic_prime = OptionCriticFeatures()
option_critic_prime.load_state_dict(option_critic.state_dict())
optim = torch.optim.RMSprop(option_critic.parameters(), lr=0.0005)

obs = torch.randn(1, 4)
state = option_critic.get_state(obs)
greedy_option = option_critic.get_Q(state).argmax(dim=-1).item()
current_option = 0
for step in range(3):
    action, logp, entropy = option_critic.get_action(state, current_option)
    next_obs, reward, done = torch.randn(1, 4), 1.0, 0.0
    state = option_critic.get_state(next_obs)
    option_termination, greedy_option = option_critic.predict_option_termination(state, current_option)
    loss = actor_loss_fn(obs, current_option, logp, entropy, reward, done, next_obs, option_critic, option_critic_prime)
    optim.zero_grad()
    loss.sum().backward()
    optim.step()
    state = option_critic.get_state(next_obs)
    obs = next_obs
print(loss.sum().item())
