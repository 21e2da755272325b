# Reproduction of https://github.com/1Konny/FactorVAE/issues/15 (solver.py train(), VAE then discriminator update).
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

torch.manual_seed(0)


def permute_dims(z):
    B, _ = z.size()
    perm_z = []
    for z_j in z.split(1, 1):
        perm = torch.randperm(B)
        perm_z.append(z_j[perm])
    return torch.cat(perm_z, 1)


class VAE(nn.Module):
    def __init__(self, z_dim=3):
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(8, 8), nn.ReLU(True), nn.Linear(8, 2 * z_dim))
        self.decode = nn.Linear(z_dim, 8)
        self.z_dim = z_dim

    def forward(self, x):
        stats = self.encode(x)
        mu, logvar = stats[:, :self.z_dim], stats[:, self.z_dim:]
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.decode(z), mu, logvar, z.squeeze()


VAE_model = VAE()
D = nn.Sequential(nn.Linear(3, 6), nn.LeakyReLU(0.2, True), nn.Linear(6, 2))
optim_VAE = optim.Adam(VAE_model.parameters(), lr=1e-4)
optim_D = optim.Adam(D.parameters(), lr=1e-4)
gamma = 6.4
ones = torch.ones(5, dtype=torch.long)
zeros = torch.zeros(5, dtype=torch.long)
x_true1, x_true2 = torch.randn(5, 8), torch.randn(5, 8)

x_recon, mu, logvar, z = VAE_model(x_true1)
vae_recon_loss = F.mse_loss(x_recon, x_true1)
vae_kld = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1).mean()
D_z = D(z)
vae_tc_loss = (D_z[:, :1] - D_z[:, 1:]).mean()
vae_loss = vae_recon_loss + vae_kld + gamma*vae_tc_loss

optim_VAE.zero_grad()
vae_loss.backward(retain_graph=True)
optim_VAE.step()

z_prime = VAE_model(x_true2)[3]
z_pperm = permute_dims(z_prime).detach()
D_z_pperm = D(z_pperm)
D_tc_loss = 0.5*(F.cross_entropy(D_z, zeros) + F.cross_entropy(D_z_pperm, ones))

optim_D.zero_grad()
D_tc_loss.backward()
optim_D.step()
print(D_tc_loss.item())
