# Reproduction of https://github.com/facebookresearch/pytorch_GAN_zoo/issues/83 (models/base_GAN.py, optimizeParameters, GDPP).
import torch
import torch.nn as nn

torch.manual_seed(0)


def GDPPLoss(phiFake, phiReal, backward=True):
    def compute_diversity(phi):
        phi = nn.functional.normalize(phi, p=2, dim=1)
        SB = torch.mm(phi, phi.t())
        eigVals, eigVecs = torch.linalg.eigh(SB)
        return eigVals, eigVecs

    fakeEigVals, fakeEigVecs = compute_diversity(phiFake)
    realEigVals, realEigVecs = compute_diversity(phiReal)
    magnitudeLoss = 0.0001 * nn.functional.mse_loss(fakeEigVals, realEigVals)
    structureLoss = -torch.sum(torch.mul(fakeEigVecs, realEigVecs), 0)
    gdppLoss = magnitudeLoss + structureLoss.sum()
    if backward:
        gdppLoss.backward()
    return gdppLoss.item()


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 6), nn.LeakyReLU(0.2))
        self.decision = nn.Linear(6, 1)

    def forward(self, x, getFeature=False):
        feature = self.features(x)
        out = self.decision(feature)
        if getFeature:
            return out, feature
        return out


netG = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
netD = Discriminator()
optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-3)
real_input = torch.randn(5, 8)
inputLatent = torch.randn(5, 4)

optimizerG.zero_grad()
predFakeG = netG(inputLatent)
predFakeD, phiGFake = netD(predFakeG, True)
lossGFake = nn.functional.softplus(-predFakeD).mean()
lossGFake.backward()
_, phiDReal = netD.forward(real_input, True)
lossGFake += GDPPLoss(phiGFake, phiDReal, backward=True)
optimizerG.step()
print(lossGFake.item())
