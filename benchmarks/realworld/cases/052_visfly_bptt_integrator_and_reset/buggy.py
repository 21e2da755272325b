# Reproduction of https://github.com/SJTU-ViSYS-team/VisFly/pull/35 (Dynamics.reset partial branch, Integrator.integrate, BPTT).
import torch
import torch.nn as nn

torch.manual_seed(0)


class Integrator:
    @staticmethod
    def integrate(pos, vel, acc, dt):
        d_pos = vel
        pos += d_pos * dt
        vel = vel + acc * dt
        return pos, vel


class Dynamics:
    def __init__(self, num_agent=3, dt=0.1):
        self.dt = dt
        self._position = torch.zeros(3, num_agent)
        self._velocity = torch.zeros(3, num_agent)

    @property
    def position(self):
        return self._position.T

    def reset(self, indices=None):
        if indices is None:
            self._position = torch.zeros_like(self._position)
            self._velocity = torch.zeros_like(self._velocity)
        else:
            self._position[:, indices] = 0.0
            self._velocity[:, indices] = 0.0

    def step(self, action):
        acc = action.T
        self._position, self._velocity = Integrator.integrate(self._position, self._velocity, acc, self.dt)


policy = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 3))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
dynamics = Dynamics()
target = torch.tensor([1.0, 0.0, 1.0])
dynamics.reset()
rewards = []
for t in range(4):
    action = policy(dynamics.position)
    dynamics.step(action)
    reward = -(dynamics.position - target).norm(dim=1)
    rewards.append(reward)
    done = reward < -1.3
    if done.any():
        dynamics.reset(indices=torch.nonzero(done).flatten())
actor_loss = -torch.stack(rewards).sum()
optimizer.zero_grad()
actor_loss.backward()
optimizer.step()
print(actor_loss.item())
