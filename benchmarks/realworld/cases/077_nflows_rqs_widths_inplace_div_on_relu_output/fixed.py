# Reproduction of https://github.com/bayesiains/nflows/issues/89 (nflows/transforms/coupling.py, line 555 upstream:
# the coupling scales views of the transform net's output in place; the user's transform net ends in a ReLU, and
# the rational-quadratic spline is reduced to a softmax-weighted monotone map).
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class TransformNet(nn.Module):
    def __init__(self, in_features, out_features, hidden_features):
        super().__init__()
        self.hidden_features = hidden_features
        self.net = nn.Sequential(nn.Linear(in_features, hidden_features), nn.ReLU(),
                                 nn.Linear(hidden_features, out_features), nn.ReLU())

    def forward(self, inputs, context=None):
        return self.net(inputs)


class PiecewiseRationalQuadraticCouplingTransform(nn.Module):
    def __init__(self, features, transform_net_create_fn, num_bins=4):
        super().__init__()
        self.num_bins = num_bins
        self.features = features
        self.transform_net = transform_net_create_fn(features // 2, (features - features // 2) * self._transform_dim_multiplier())

    def _transform_dim_multiplier(self):
        return self.num_bins * 3 - 1

    def forward(self, inputs):
        identity, transform = inputs[:, :self.features // 2], inputs[:, self.features // 2:]
        transform_params = self.transform_net(identity)
        outputs, logabsdet = self._elementwise(transform, transform_params)
        return torch.cat([identity, outputs], dim=1), logabsdet

    def _elementwise(self, inputs, transform_params):
        batch_size, features = inputs.shape[0], inputs.shape[1]
        transform_params = transform_params.reshape(batch_size, features, self._transform_dim_multiplier())
        unnormalized_widths = transform_params[..., : self.num_bins]
        unnormalized_heights = transform_params[..., self.num_bins: 2 * self.num_bins]
        unnormalized_derivatives = transform_params[..., 2 * self.num_bins:]

        if hasattr(self.transform_net, "hidden_features"):
            unnormalized_widths = unnormalized_widths / np.sqrt(self.transform_net.hidden_features)
            unnormalized_heights = unnormalized_heights / np.sqrt(self.transform_net.hidden_features)

        widths = F.softmax(unnormalized_widths, dim=-1)
        heights = F.softmax(unnormalized_heights, dim=-1)
        slopes = F.softplus(unnormalized_derivatives).mean(-1) + 1e-3
        scale = (heights / widths).mean(-1) * slopes
        return inputs * scale, torch.log(scale).sum(-1)


flow = PiecewiseRationalQuadraticCouplingTransform(4, lambda i, o: TransformNet(i, o, hidden_features=16))
optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3)
x = torch.randn(8, 4)
z, logabsdet = flow(x)
loss = -(-0.5 * z.pow(2).sum(1) + logabsdet).mean()
optimizer.zero_grad()
loss.backward()
optimizer.step()
print(loss.item())
