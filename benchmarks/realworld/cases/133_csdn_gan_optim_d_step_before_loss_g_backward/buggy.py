# Reproduction of https://blog.csdn.net/odbej/article/details/125158288 (a CSDN post on the inplace error in GAN
# training: g = G(t), d = D(g) are built once, lossD.backward(retain_graph=True) keeps the graph, optimD.step()
# updates D's weights in place, and lossG.backward() then needs the old weights that D(g) saved. The post's names;
# small MLPs and random data).
import torch
import torch.nn as nn

torch.manual_seed(0)

G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 8))
D = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
optimG = torch.optim.Adam(G.parameters(), lr=1e-3)
optimD = torch.optim.Adam(D.parameters(), lr=1e-3)

for epoch in range(2):
    r = torch.randn(16, 8)  # real samples
    t = torch.randn(16, 4)  # noise
    g = G(t)
    d = D(g)
    lossD = -torch.mean(torch.log(D(r)) + torch.log(1 - d))
    optimD.zero_grad()
    lossD.backward(retain_graph=True)
    optimD.step()

    lossG = -torch.mean(torch.log(d))
    optimG.zero_grad()
    lossG.backward()
    optimG.step()
    print(epoch, lossD.item(), lossG.item())
