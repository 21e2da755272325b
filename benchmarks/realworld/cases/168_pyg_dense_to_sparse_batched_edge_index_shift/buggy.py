# Reproduction of https://github.com/pyg-team/pytorch_geometric/issues/10318 (PyG's dense_to_sparse on a batched,
# three-dimensional adjacency: the edge weights are gathered with flatten_adj[edge_index[0], edge_index[1]], which
# saves both index rows for its backward, and then the column row is shifted per graph in place,
# edge_index[1] += offset[edge_index[0]], so backpropagating into the dense adjacency fails with "modified by an
# inplace operation" on a LongTensor; the 2D branch never shifts and works. The library function as it is (mask
# branch kept, cumsum inlined) and the reproduction from the fixing pull request, pyg-team/pytorch_geometric#10758).
import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

torch.manual_seed(0)


def cumsum(x: Tensor, dim: int = 0) -> Tensor:
    size = x.size()[:dim] + (x.size(dim) + 1, ) + x.size()[dim + 1:]
    out = x.new_empty(size)
    out.narrow(dim, 0, 1).zero_()
    torch.cumsum(x, dim=dim, out=out.narrow(dim, 1, x.size(dim)))
    return out


def dense_to_sparse(
    adj: Tensor,
    mask: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    if adj.dim() < 2 or adj.dim() > 3:
        raise ValueError(f"Dense adjacency matrix 'adj' must be two- or "
                         f"three-dimensional (got {adj.dim()} dimensions)")

    if mask is not None and adj.dim() == 2:
        warnings.warn("Mask should not be provided in case the dense "
                      "adjacency matrix is two-dimensional")
        mask = None

    if adj.dim() == 2:
        edge_index = adj.nonzero().t()
        edge_attr = adj[edge_index[0], edge_index[1]]
        return edge_index, edge_attr
    else:
        flatten_adj = adj.view(-1, adj.size(-1))
        if mask is not None:
            flatten_adj = flatten_adj[mask.view(-1)]
        edge_index = flatten_adj.nonzero().t()
        edge_attr = flatten_adj[edge_index[0], edge_index[1]]

        if mask is None:
            offset = torch.arange(
                start=0,
                end=adj.size(0) * adj.size(2),
                step=adj.size(2),
                device=adj.device,
            )
            offset = offset.repeat_interleave(adj.size(1))
        else:
            count = mask.sum(dim=-1)
            offset = cumsum(count)[:-1]
            offset = offset.repeat_interleave(count)

        edge_index[1] += offset[edge_index[0]]

        return edge_index, edge_attr


adj = torch.rand(1, 5, 5, requires_grad=True)
edge_index, edge_attr = dense_to_sparse(adj)
edge_attr.sum().backward()

print(adj.grad.shape)
