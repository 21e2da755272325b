# Reproduction of https://github.com/cross32768/Dreamer_PyTorch/issues/2 (train.py, updates of value and action models).
import torch
from torch import nn
from torch.nn.functional import mse_loss
from torch.nn.utils import clip_grad_norm_

torch.manual_seed(0)


class ValueModel(nn.Module):
    def __init__(self, state_dim, hidden_dim=16):
        super().__init__()
        self.fc1 = nn.Linear(state_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, 1)

    def forward(self, state):
        return self.fc2(torch.relu(self.fc1(state)))


class ActionModel(nn.Module):
    def __init__(self, state_dim, action_dim, hidden_dim=16):
        super().__init__()
        self.fc1 = nn.Linear(state_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, action_dim)

    def forward(self, state):
        return torch.tanh(self.fc2(torch.relu(self.fc1(state))))


def lambda_target(rewards, values, gamma, lambda_):
    V_lambda = torch.zeros_like(rewards)
    H = rewards.shape[0] - 1
    V_n = torch.zeros_like(rewards)
    V_n[H] = values[H]
    for n in range(1, H+1):
        V_n[:-n] = (gamma ** n) * values[n:]
        for k in range(1, n+1):
            if k == n:
                V_n[:-n] += (gamma ** (n-1)) * rewards[k:]
            else:
                V_n[:-n] += (gamma ** (k-1)) * rewards[k:-n+k]
        if n == H:
            V_lambda += (lambda_ ** (H-1)) * V_n
        else:
            V_lambda += (1 - lambda_) * (lambda_ ** (n-1)) * V_n
    return V_lambda


state_dim, action_dim, horizon = 6, 2, 4
value_model, action_model = ValueModel(state_dim), ActionModel(state_dim, action_dim)
transition = nn.Linear(state_dim + action_dim, state_dim)
value_optimizer = torch.optim.Adam(value_model.parameters(), lr=8e-5)
action_optimizer = torch.optim.Adam(action_model.parameters(), lr=8e-5)

state = torch.randn(3, state_dim)
imaginated_states = []
for h in range(horizon):
    action = action_model(state)
    state = transition(torch.cat([state, action], dim=1))
    imaginated_states.append(state)
imaginated_states = torch.stack(imaginated_states)
imaginated_rewards = imaginated_states.sum(dim=2)
imaginated_values = value_model(imaginated_states).squeeze(-1)
lambda_target_values = lambda_target(imaginated_rewards, imaginated_values, 0.9, 0.95)

# update value model
value_loss = 0.5 * mse_loss(imaginated_values, lambda_target_values.detach())
value_optimizer.zero_grad()
value_loss.backward(retain_graph=True)
clip_grad_norm_(value_model.parameters(), 100)
value_optimizer.step()

# update action model (multiply -1 for gradient ascent)
action_loss = -1 * (lambda_target_values.mean())
action_optimizer.zero_grad()
action_loss.backward()
clip_grad_norm_(action_model.parameters(), 100)
action_optimizer.step()
print(action_loss.item())
