# Reproduction of https://github.com/benedekrozemberczki/pytorch_geometric_temporal/issues/57
# (torch_geometric_temporal/nn/convolutional/stgcn.py line 131; ChebConv reduced to a K=1 normalised graph conv).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class GraphConv(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index, edge_weight):
        h = self.lin(x)
        row, col = edge_index
        return h + torch.zeros_like(h).index_add(0, col, h[row] * edge_weight[:, None])


class STConv(nn.Module):
    def __init__(self, num_nodes, in_channels, hidden_channels, out_channels, kernel_size):
        super().__init__()
        self._temporal_conv1 = nn.Conv2d(in_channels, hidden_channels, (1, kernel_size))
        self._graph_conv = GraphConv(hidden_channels, hidden_channels)
        self._temporal_conv2 = nn.Conv2d(hidden_channels, out_channels, (1, kernel_size))
        self._batch_norm = nn.BatchNorm2d(num_nodes)

    def forward(self, X, edge_index, edge_weight):
        # X: (batch, time, nodes, channels)
        T_0 = self._temporal_conv1(X.permute(0, 3, 2, 1)).permute(0, 3, 2, 1)
        T = torch.zeros_like(T_0).to(T_0.device)
        T = T + T_0
        for b in range(T_0.size(0)):
            for t in range(T_0.size(1)):
                T[b][t] = self._graph_conv(T[b][t], edge_index, edge_weight)
        T = F.relu(T)
        T = self._temporal_conv2(T.permute(0, 3, 2, 1)).permute(0, 3, 2, 1)
        T = T.permute(0, 2, 1, 3)
        T = self._batch_norm(T)
        return T.permute(0, 2, 1, 3)


num_nodes = 5
edge_index = torch.tensor([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 0, 0]])
edge_weight = torch.rand(6)
model = STConv(num_nodes, in_channels=2, hidden_channels=8, out_channels=4, kernel_size=2)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
X, y = torch.randn(2, 6, num_nodes, 2), torch.randn(2, 4, num_nodes, 4)
loss = F.mse_loss(model(X, edge_index, edge_weight), y)
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
