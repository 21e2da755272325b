# Reproduction of https://github.com/pytorch/vision/issues/7174 (torchvision/ops/misc.py MLP, inlined as released
# in torchvision 0.14; the two-line reproduction).
import torch

torch.manual_seed(0)


class MLP(torch.nn.Sequential):
    def __init__(self, in_channels, hidden_channels, norm_layer=None, activation_layer=torch.nn.ReLU, inplace=True,
                 bias=True, dropout=0.0):
        # The addition of `norm_layer` is inspired from the implementation of TorchMultimodal:
        params = {} if inplace is None else {"inplace": inplace}

        layers = []
        in_dim = in_channels
        for hidden_dim in hidden_channels[:-1]:
            layers.append(torch.nn.Linear(in_dim, hidden_dim, bias=bias))
            if norm_layer is not None:
                layers.append(norm_layer(hidden_dim))
            layers.append(activation_layer(**params))
            layers.append(torch.nn.Dropout(dropout, **params))
            in_dim = hidden_dim

        layers.append(torch.nn.Linear(in_dim, hidden_channels[-1], bias=bias))
        layers.append(torch.nn.Dropout(dropout, **params))

        super().__init__(*layers)


MLP(3, [3, 3], dropout=0.5, inplace=False)(torch.rand(3)).sum().backward()  # no error
MLP(3, [3, 3], dropout=0.5, inplace=False)(torch.rand(3)).sum().backward()  # causes an error
