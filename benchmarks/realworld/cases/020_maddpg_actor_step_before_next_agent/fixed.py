# Reproduction of https://github.com/philtabor/Multi-Agent-Deep-Deterministic-Policy-Gradients/issues/2 (maddpg.py learn()).
import torch as T
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

T.manual_seed(0)


class CriticNetwork(nn.Module):
    def __init__(self, beta, input_dims, fc1_dims, n_agents, n_actions):
        super(CriticNetwork, self).__init__()
        self.fc1 = nn.Linear(input_dims+n_agents*n_actions, fc1_dims)
        self.q = nn.Linear(fc1_dims, 1)
        self.optimizer = optim.Adam(self.parameters(), lr=beta)

    def forward(self, state, action):
        x = F.relu(self.fc1(T.cat([state, action], dim=1)))
        return self.q(x)


class ActorNetwork(nn.Module):
    def __init__(self, alpha, input_dims, fc1_dims, n_actions):
        super(ActorNetwork, self).__init__()
        self.fc1 = nn.Linear(input_dims, fc1_dims)
        self.pi = nn.Linear(fc1_dims, n_actions)
        self.optimizer = optim.Adam(self.parameters(), lr=alpha)

    def forward(self, state):
        x = F.relu(self.fc1(state))
        return T.softmax(self.pi(x), dim=1)


class Agent:
    def __init__(self, actor_dims, critic_dims, n_actions, n_agents, gamma=0.95):
        self.gamma = gamma
        self.actor = ActorNetwork(0.01, actor_dims, 8, n_actions)
        self.critic = CriticNetwork(0.01, critic_dims, 8, n_agents, n_actions)
        self.target_actor = ActorNetwork(0.01, actor_dims, 8, n_actions)
        self.target_critic = CriticNetwork(0.01, critic_dims, 8, n_agents, n_actions)


class MADDPG:
    def __init__(self, n_agents=2, actor_dims=4, critic_dims=8, n_actions=2):
        self.agents = [Agent(actor_dims, critic_dims, n_actions, n_agents) for _ in range(n_agents)]

    def learn(self, actor_states, states, actions, rewards, actor_new_states, states_, dones):
        all_agents_new_actions = []
        all_agents_new_mu_actions = []
        old_agents_actions = []
        for agent_idx, agent in enumerate(self.agents):
            new_pi = agent.target_actor.forward(actor_new_states[agent_idx])
            all_agents_new_actions.append(new_pi)
            pi = agent.actor.forward(actor_states[agent_idx])
            all_agents_new_mu_actions.append(pi)
            old_agents_actions.append(actions[agent_idx])
        new_actions = T.cat([acts for acts in all_agents_new_actions], dim=1)
        mu = T.cat([acts for acts in all_agents_new_mu_actions], dim=1)
        old_actions = T.cat([acts for acts in old_agents_actions],dim=1)

        for agent_idx, agent in enumerate(self.agents):
            critic_value_ = agent.target_critic.forward(states_, new_actions).flatten()
            critic_value_[dones[:,0]] = 0.0
            critic_value = agent.critic.forward(states, old_actions).flatten()

            target = rewards[:,agent_idx] + agent.gamma*critic_value_
            critic_loss = F.mse_loss(target, critic_value)
            agent.critic.optimizer.zero_grad()
            critic_loss.backward(retain_graph=True)
            agent.critic.optimizer.step()

            actor_loss = agent.critic.forward(states, mu).flatten()
            actor_loss = -T.mean(actor_loss)
            agent.actor.optimizer.zero_grad()
            actor_loss.backward(retain_graph=True)

        for agent in self.agents:
            agent.actor.optimizer.step()


maddpg = MADDPG()
B = 5
actor_states = [T.randn(B, 4) for _ in range(2)]
actions = [T.softmax(T.randn(B, 2), dim=1) for _ in range(2)]
maddpg.learn(actor_states, T.randn(B, 8), actions, T.randn(B, 2), [T.randn(B, 4) for _ in range(2)],
             T.randn(B, 8), T.zeros(B, 2, dtype=T.bool))
print("done")
