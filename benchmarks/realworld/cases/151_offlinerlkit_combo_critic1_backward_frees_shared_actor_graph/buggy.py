# Reproduction of https://github.com/yihaosun1124/OfflineRL-Kit/issues/15 (a question on OfflineRL-Kit's
# COMBOPolicy.learn: with with_lagrange=False, removing retain_graph=True from critic1_loss.backward() gives "Trying to
# backward through the graph a second time". The reason: calc_pi_values samples act = actforward(obs) with autograd on
# and feeds the same act to critic1 and critic2, so both conservative losses reach the actor's sampling graph, which
# critic1_loss.backward() frees. COMBOPolicy.learn as in the library with retain_graph removed (the user's edit), the
# SAC/CQL methods it inherits, and the MLP/ActorProb/TanhDiagGaussian/Critic modules, shrunk (small MLPs, fixed alpha,
# a random real/fake batch instead of the D4RL data and dynamics rollouts, CPU)).
import numpy as np
import torch
import torch.nn as nn
from typing import Dict, List, Optional, Tuple, Union

torch.manual_seed(0)
np.random.seed(0)


class MLP(nn.Module):
    def __init__(self, input_dim: int, hidden_dims: Union[List[int], Tuple[int]], output_dim: Optional[int] = None,
                 activation: nn.Module = nn.ReLU) -> None:
        super().__init__()
        hidden_dims = [input_dim] + list(hidden_dims)
        model = []
        for in_dim, out_dim in zip(hidden_dims[:-1], hidden_dims[1:]):
            model += [nn.Linear(in_dim, out_dim), activation()]
        self.output_dim = hidden_dims[-1]
        if output_dim is not None:
            model += [nn.Linear(hidden_dims[-1], output_dim)]
            self.output_dim = output_dim
        self.model = nn.Sequential(*model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class TanhNormalWrapper(torch.distributions.Normal):
    def __init__(self, loc, scale, max_action):
        super().__init__(loc, scale)
        self._max_action = max_action

    def log_prob(self, action, raw_action=None):
        squashed_action = action/self._max_action
        if raw_action is None:
            raw_action = self.arctanh(squashed_action)
        log_prob = super().log_prob(raw_action).sum(-1, keepdim=True)
        eps = 1e-6
        log_prob = log_prob - torch.log(self._max_action*(1 - squashed_action.pow(2)) + eps).sum(-1, keepdim=True)
        return log_prob

    def arctanh(self, x):
        one_plus_x = (1 + x).clamp(min=1e-6)
        one_minus_x = (1 - x).clamp(min=1e-6)
        return 0.5 * torch.log(one_plus_x / one_minus_x)

    def rsample(self):
        raw_action = super().rsample()
        action = self._max_action * torch.tanh(raw_action)
        return action, raw_action


class TanhDiagGaussian(nn.Module):
    def __init__(self, latent_dim, output_dim, unbounded=False, conditioned_sigma=False, max_mu=1.0,
                 sigma_min=-5.0, sigma_max=2.0):
        super().__init__()
        self.mu = nn.Linear(latent_dim, output_dim)
        self._c_sigma = conditioned_sigma
        if conditioned_sigma:
            self.sigma = nn.Linear(latent_dim, output_dim)
        else:
            self.sigma_param = nn.Parameter(torch.zeros(output_dim, 1))
        self._unbounded = unbounded
        self._max = max_mu
        self._sigma_min = sigma_min
        self._sigma_max = sigma_max

    def forward(self, logits):
        mu = self.mu(logits)
        if not self._unbounded:
            mu = self._max * torch.tanh(mu)
        if self._c_sigma:
            sigma = torch.clamp(self.sigma(logits), min=self._sigma_min, max=self._sigma_max).exp()
        else:
            shape = [1] * len(mu.shape)
            shape[1] = -1
            sigma = (self.sigma_param.view(shape) + torch.zeros_like(mu)).exp()
        return TanhNormalWrapper(mu, sigma, self._max)


class ActorProb(nn.Module):
    def __init__(self, backbone: nn.Module, dist_net: nn.Module, device: str = "cpu") -> None:
        super().__init__()
        self.device = torch.device(device)
        self.backbone = backbone.to(device)
        self.dist_net = dist_net.to(device)

    def forward(self, obs):
        obs = torch.as_tensor(obs, device=self.device, dtype=torch.float32)
        logits = self.backbone(obs)
        dist = self.dist_net(logits)
        return dist


class Critic(nn.Module):
    def __init__(self, backbone: nn.Module, device: str = "cpu") -> None:
        super().__init__()
        self.device = torch.device(device)
        self.backbone = backbone.to(device)
        latent_dim = getattr(backbone, "output_dim")
        self.last = nn.Linear(latent_dim, 1).to(device)

    def forward(self, obs, actions=None):
        obs = torch.as_tensor(obs, device=self.device, dtype=torch.float32)
        if actions is not None:
            actions = torch.as_tensor(actions, device=self.device, dtype=torch.float32).flatten(1)
            obs = torch.cat([obs, actions], dim=1)
        logits = self.backbone(obs)
        values = self.last(logits)
        return values


class Box:  # gym.spaces.Box(-1, 1, (action_dim,))
    def __init__(self, low, high, shape):
        self.low, self.high, self.shape = np.full(shape, low), np.full(shape, high), shape


class COMBOPolicy(nn.Module):  # SACPolicy -> CQLPolicy -> COMBOPolicy, folded together
    def __init__(self, actor, critic1, critic2, actor_optim, critic1_optim, critic2_optim, action_space,
                 tau=0.005, gamma=0.99, alpha=0.2, cql_weight=1.0, temperature=1.0, deterministic_backup=True,
                 num_repeart_actions=10, rho_s="mix"):
        super().__init__()
        self.actor = actor
        self.critic1, self.critic1_old = critic1, Critic(MLP(critic1.backbone.model[0].in_features, [32, 32]))
        self.critic1_old.load_state_dict(self.critic1.state_dict())
        self.critic1_old.eval()
        self.critic2, self.critic2_old = critic2, Critic(MLP(critic2.backbone.model[0].in_features, [32, 32]))
        self.critic2_old.load_state_dict(self.critic2.state_dict())
        self.critic2_old.eval()
        self.actor_optim = actor_optim
        self.critic1_optim = critic1_optim
        self.critic2_optim = critic2_optim
        self._tau = tau
        self._gamma = gamma
        self._is_auto_alpha = False
        self._alpha = alpha
        self.action_space = action_space
        self._cql_weight = cql_weight
        self._temperature = temperature
        self._deterministic_backup = deterministic_backup
        self._num_repeat_actions = num_repeart_actions
        self._rho_s = rho_s

    def _sync_weight(self) -> None:
        for o, n in zip(self.critic1_old.parameters(), self.critic1.parameters()):
            o.data.copy_(o.data * (1.0 - self._tau) + n.data * self._tau)
        for o, n in zip(self.critic2_old.parameters(), self.critic2.parameters()):
            o.data.copy_(o.data * (1.0 - self._tau) + n.data * self._tau)

    def actforward(self, obs: torch.Tensor, deterministic: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        dist = self.actor(obs)
        squashed_action, raw_action = dist.rsample()
        log_prob = dist.log_prob(squashed_action, raw_action)
        return squashed_action, log_prob

    def calc_pi_values(self, obs_pi: torch.Tensor, obs_to_pred: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        act, log_prob = self.actforward(obs_pi)

        q1 = self.critic1(obs_to_pred, act)
        q2 = self.critic2(obs_to_pred, act)

        return q1 - log_prob.detach(), q2 - log_prob.detach()

    def calc_random_values(self, obs: torch.Tensor, random_act: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        q1 = self.critic1(obs, random_act)
        q2 = self.critic2(obs, random_act)

        log_prob1 = np.log(0.5**random_act.shape[-1])
        log_prob2 = np.log(0.5**random_act.shape[-1])

        return q1 - log_prob1, q2 - log_prob2

    def learn(self, batch: Dict) -> Dict[str, float]:
        real_batch, fake_batch = batch["real"], batch["fake"]
        mix_batch = {k: torch.cat([real_batch[k], fake_batch[k]], 0) for k in real_batch.keys()}

        obss, actions, next_obss, rewards, terminals = mix_batch["observations"], mix_batch["actions"], \
            mix_batch["next_observations"], mix_batch["rewards"], mix_batch["terminals"]
        batch_size = obss.shape[0]

        # update actor
        a, log_probs = self.actforward(obss)
        q1a, q2a = self.critic1(obss, a), self.critic2(obss, a)
        actor_loss = (self._alpha * log_probs - torch.min(q1a, q2a)).mean()
        self.actor_optim.zero_grad()
        actor_loss.backward()
        self.actor_optim.step()

        # compute td error
        with torch.no_grad():
            next_actions, next_log_probs = self.actforward(next_obss)
            next_q = torch.min(
                self.critic1_old(next_obss, next_actions),
                self.critic2_old(next_obss, next_actions)
            )
            if not self._deterministic_backup:
                next_q -= self._alpha * next_log_probs

        target_q = rewards + self._gamma * (1 - terminals) * next_q
        q1, q2 = self.critic1(obss, actions), self.critic2(obss, actions)
        critic1_loss = ((q1 - target_q).pow(2)).mean()
        critic2_loss = ((q2 - target_q).pow(2)).mean()

        # compute conservative loss
        if self._rho_s == "model":
            obss, actions, next_obss = fake_batch["observations"], \
                fake_batch["actions"], fake_batch["next_observations"]

        batch_size = len(obss)
        random_actions = torch.FloatTensor(
            batch_size * self._num_repeat_actions, actions.shape[-1]
        ).uniform_(self.action_space.low[0], self.action_space.high[0]).to(self.actor.device)
        # tmp_obss & tmp_next_obss: (batch_size * num_repeat, obs_dim)
        tmp_obss = obss.unsqueeze(1) \
            .repeat(1, self._num_repeat_actions, 1) \
            .view(batch_size * self._num_repeat_actions, obss.shape[-1])
        tmp_next_obss = next_obss.unsqueeze(1) \
            .repeat(1, self._num_repeat_actions, 1) \
            .view(batch_size * self._num_repeat_actions, obss.shape[-1])

        obs_pi_value1, obs_pi_value2 = self.calc_pi_values(tmp_obss, tmp_obss)
        next_obs_pi_value1, next_obs_pi_value2 = self.calc_pi_values(tmp_next_obss, tmp_obss)
        random_value1, random_value2 = self.calc_random_values(tmp_obss, random_actions)

        for value in [
            obs_pi_value1, obs_pi_value2, next_obs_pi_value1, next_obs_pi_value2,
            random_value1, random_value2
        ]:
            value.reshape(batch_size, self._num_repeat_actions, 1)

        # cat_q shape: (batch_size, 3 * num_repeat, 1)
        cat_q1 = torch.cat([obs_pi_value1, next_obs_pi_value1, random_value1], 1)
        cat_q2 = torch.cat([obs_pi_value2, next_obs_pi_value2, random_value2], 1)
        # Samples from the original dataset
        real_obss, real_actions = real_batch['observations'], real_batch['actions']
        q1, q2 = self.critic1(real_obss, real_actions), self.critic2(real_obss, real_actions)

        conservative_loss1 = \
            torch.logsumexp(cat_q1 / self._temperature, dim=1).mean() * self._cql_weight * self._temperature - \
            q1.mean() * self._cql_weight
        conservative_loss2 = \
            torch.logsumexp(cat_q2 / self._temperature, dim=1).mean() * self._cql_weight * self._temperature - \
            q2.mean() * self._cql_weight

        critic1_loss = critic1_loss + conservative_loss1
        critic2_loss = critic2_loss + conservative_loss2

        # update critic
        self.critic1_optim.zero_grad()
        critic1_loss.backward()
        self.critic1_optim.step()

        self.critic2_optim.zero_grad()
        critic2_loss.backward()
        self.critic2_optim.step()

        self._sync_weight()

        return {
            "loss/actor": actor_loss.item(),
            "loss/critic1": critic1_loss.item(),
            "loss/critic2": critic2_loss.item()
        }


obs_dim, action_dim, hidden_dims, n = 5, 2, [32, 32], 8
actor_backbone = MLP(input_dim=obs_dim, hidden_dims=hidden_dims)
critic1_backbone = MLP(input_dim=obs_dim + action_dim, hidden_dims=hidden_dims)
critic2_backbone = MLP(input_dim=obs_dim + action_dim, hidden_dims=hidden_dims)
dist = TanhDiagGaussian(latent_dim=getattr(actor_backbone, "output_dim"), output_dim=action_dim,
                        unbounded=True, conditioned_sigma=True)
actor = ActorProb(actor_backbone, dist)
critic1 = Critic(critic1_backbone)
critic2 = Critic(critic2_backbone)
actor_optim = torch.optim.Adam(actor.parameters(), lr=1e-4)
critic1_optim = torch.optim.Adam(critic1.parameters(), lr=3e-4)
critic2_optim = torch.optim.Adam(critic2.parameters(), lr=3e-4)
policy = COMBOPolicy(actor, critic1, critic2, actor_optim, critic1_optim, critic2_optim,
                     action_space=Box(-1.0, 1.0, (action_dim,)), cql_weight=5.0, num_repeart_actions=4)


def random_batch():
    return {"observations": torch.randn(n, obs_dim), "actions": torch.rand(n, action_dim) * 2 - 1,
            "next_observations": torch.randn(n, obs_dim), "rewards": torch.randn(n, 1),
            "terminals": torch.zeros(n, 1)}


for step in range(3):
    result = policy.learn({"real": random_batch(), "fake": random_batch()})
print(result)
