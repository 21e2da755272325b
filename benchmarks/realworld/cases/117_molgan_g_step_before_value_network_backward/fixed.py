# Reproduction of https://github.com/kfzyqin/Implementation-MolGAN-PyTorch/issues/1 (solver_gan.py train_or_valid at
# the time of the issue: the generator step runs self.g_optimizer.step() between train_step_G.backward(retain_graph=True)
# and train_step_V.backward(), and loss_V reaches the generator's layers through value_logit_fake = V(edges_hat, ...);
# the step rewrote the weights they saved. Generator, discriminator and value network shrunk to MLPs over a 4-atom
# graph; RDKit rewards replaced by a fixed score of the hard graph; logging, validation and checkpoints dropped).
from collections import defaultdict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
np.random.seed(0)


class Generator(nn.Module):
    def __init__(self, z_dim, vertexes, edges, nodes):
        super(Generator, self).__init__()
        self.vertexes, self.edges, self.nodes = vertexes, edges, nodes
        self.layers = nn.Sequential(nn.Linear(z_dim, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.edges_layer = nn.Linear(32, edges * vertexes * vertexes)
        self.nodes_layer = nn.Linear(32, vertexes * nodes)

    def forward(self, x):
        output = self.layers(x)
        edges_logits = self.edges_layer(output).view(-1, self.edges, self.vertexes, self.vertexes)
        edges_logits = (edges_logits + edges_logits.permute(0, 1, 3, 2)) / 2
        edges_logits = edges_logits.permute(0, 2, 3, 1)
        nodes_logits = self.nodes_layer(output).view(-1, self.vertexes, self.nodes)
        return edges_logits, nodes_logits


class Discriminator(nn.Module):
    def __init__(self, vertexes, edges, nodes):
        super(Discriminator, self).__init__()
        self.gcn = nn.Linear(nodes + edges * vertexes, 16)
        self.output_layer = nn.Linear(16, 1)

    def forward(self, adj, hidden, node, activation=None):
        h = torch.tanh(self.gcn(torch.cat([node, adj.flatten(2)], -1))).sum(1)
        output = self.output_layer(h)
        output = activation(output) if activation is not None else output
        return output, h


class Solver(object):
    def __init__(self):
        self.z_dim, self.m_dim, self.b_dim, self.vertexes = 8, 3, 2, 4
        self.la, self.la_gp, self.n_critic, self.num_steps, self.batch_size = 1.0, 10.0, 5, 2, 4
        self.post_method = 'softmax'
        self.G = Generator(self.z_dim, self.vertexes, self.b_dim, self.m_dim)
        self.D = Discriminator(self.vertexes, self.b_dim, self.m_dim)
        self.V = Discriminator(self.vertexes, self.b_dim, self.m_dim)
        self.g_optimizer = torch.optim.Adam(self.G.parameters(), 1e-3, (0.5, 0.999))
        self.d_optimizer = torch.optim.Adam(self.D.parameters(), 1e-3, (0.5, 0.999))
        self.v_optimizer = torch.optim.Adam(self.V.parameters(), 1e-3, (0.5, 0.999))

    def reset_grad(self):
        self.g_optimizer.zero_grad()
        self.d_optimizer.zero_grad()
        self.v_optimizer.zero_grad()

    def gradient_penalty(self, y, x):
        weight = torch.ones(y.size())
        dydx = torch.autograd.grad(outputs=y, inputs=x, grad_outputs=weight, retain_graph=True, create_graph=True,
                                   only_inputs=True)[0]
        dydx = dydx.reshape(dydx.size(0), -1)
        return torch.mean((torch.sqrt(torch.sum(dydx ** 2, dim=1)) - 1) ** 2)

    def label2onehot(self, labels, dim):
        out = torch.zeros(list(labels.size()) + [dim])
        out.scatter_(len(out.size()) - 1, labels.unsqueeze(-1), 1.)
        return out

    def sample_z(self, batch_size):
        return np.random.normal(0, 1, size=(batch_size, self.z_dim))

    def postprocess(self, inputs, method, temperature=1.):
        softmax = [F.softmax(e_logits / temperature, -1) for e_logits in inputs]
        return [delistify for delistify in softmax]

    def reward(self, a, x):  # stands for the RDKit property scores of the decoded molecules
        return ((a.sum((1, 2)) % 3) / 2.0 + (x == 1).mean(1)).reshape(-1, 1)

    def get_reward(self, n_hat, e_hat, method):
        (edges_hard, nodes_hard) = self.postprocess((e_hat, n_hat), method)
        edges_hard, nodes_hard = torch.max(edges_hard, -1)[1], torch.max(nodes_hard, -1)[1]
        return torch.from_numpy(self.reward(edges_hard.numpy(), nodes_hard.numpy())).float()

    def train_or_valid(self, epoch_i, train_val_test='val'):
        cur_la = self.la
        losses = defaultdict(list)
        for a_step in range(self.num_steps):
            a = np.random.randint(0, self.b_dim, size=(self.batch_size, self.vertexes, self.vertexes))
            x = np.random.randint(0, self.m_dim, size=(self.batch_size, self.vertexes))
            z = self.sample_z(self.batch_size)

            a = torch.from_numpy(a).long()  # Adjacency.
            x = torch.from_numpy(x).long()  # Nodes.
            a_tensor = self.label2onehot(a, self.b_dim)
            x_tensor = self.label2onehot(x, self.m_dim)
            z = torch.from_numpy(z).float()

            # Current steps
            cur_step = self.num_steps * epoch_i + a_step

            # Compute losses with real inputs.
            logits_real, features_real = self.D(a_tensor, None, x_tensor)

            # Z-to-target
            edges_logits, nodes_logits = self.G(z)
            # Postprocess with Gumbel softmax
            (edges_hat, nodes_hat) = self.postprocess((edges_logits, nodes_logits), self.post_method)
            logits_fake, features_fake = self.D(edges_hat, None, nodes_hat)

            # Compute losses for gradient penalty.
            eps = torch.rand(logits_real.size(0), 1, 1, 1)
            x_int0 = (eps * a_tensor + (1. - eps) * edges_hat).requires_grad_(True)
            x_int1 = (eps.squeeze(-1) * x_tensor + (1. - eps.squeeze(-1)) * nodes_hat).requires_grad_(True)
            grad0, grad1 = self.D(x_int0, None, x_int1)
            grad_penalty = self.gradient_penalty(grad0, x_int0) + self.gradient_penalty(grad1, x_int1)

            d_loss_real = torch.mean(logits_real)
            d_loss_fake = torch.mean(logits_fake)
            loss_D = -d_loss_real + d_loss_fake + self.la_gp * grad_penalty

            # Optimise discriminator.
            if train_val_test == 'train' and cur_step % self.n_critic != 0 and cur_la > 0:
                self.reset_grad()
                loss_D.backward()
                self.d_optimizer.step()

            # Z-to-target
            edges_logits, nodes_logits = self.G(z)
            # Postprocess with Gumbel softmax
            (edges_hat, nodes_hat) = self.postprocess((edges_logits, nodes_logits), self.post_method)
            logits_fake, features_fake = self.D(edges_hat, None, nodes_hat)

            # Value losses
            value_logit_real, _ = self.V(a_tensor, None, x_tensor, torch.sigmoid)
            value_logit_fake, _ = self.V(edges_hat, None, nodes_hat, torch.sigmoid)

            # Real Reward
            reward_r = torch.from_numpy(self.reward(a.numpy(), x.numpy())).float()
            # Fake Reward
            reward_f = self.get_reward(nodes_hat, edges_hat, self.post_method)

            # Losses Update
            loss_G = -logits_fake
            # Original TF loss_V. Here we use absolute values instead of the squared one.
            loss_V = torch.abs(value_logit_real - reward_r) + torch.abs(value_logit_fake - reward_f)
            loss_RL = -value_logit_fake

            loss_G = torch.mean(loss_G)
            loss_V = torch.mean(loss_V)
            loss_RL = torch.mean(loss_RL)
            losses['l_G'].append(loss_G.item())
            losses['l_V'].append(loss_V.item())

            alpha = torch.abs(loss_G.detach() / loss_RL.detach()).detach()
            train_step_G = cur_la * loss_G + (1 - cur_la) * alpha * loss_RL

            train_step_V = loss_V

            if train_val_test == 'train':
                self.reset_grad()

                # Optimise generator and value network.
                if cur_step % self.n_critic == 0:
                    train_step_G.backward(retain_graph=True)
                    train_step_V.backward()
                    self.g_optimizer.step()
                    self.v_optimizer.step()
        return losses


solver = Solver()
for i in range(2):
    losses = solver.train_or_valid(epoch_i=i, train_val_test='train')
print({k: np.mean(v) for k, v in losses.items()})
