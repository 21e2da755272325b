# Actor-critic update, fixed: the critic learns from action.detach(); the actor's loss is computed with a
# fresh critic forward after the critic step, so each backward runs through weights that are still intact.
import torch
from torch import nn

torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1), nn.Tanh())
critic = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
actor_opt = torch.optim.SGD(actor.parameters(), lr=1e-2)
critic_opt = torch.optim.SGD(critic.parameters(), lr=1e-2)

for step in range(3):
    state = torch.randn(16, 3)
    target = torch.randn(16, 1)
    action = actor(state)
    q = critic(torch.cat([state, action.detach()], dim=1))
    critic_loss = ((q - target) ** 2).mean()
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    actor_loss = -critic(torch.cat([state, action], dim=1)).mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
    print(f"step {step}: critic_loss={critic_loss.item():.4f} actor_loss={actor_loss.item():.4f}")
