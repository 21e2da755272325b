# Reproduction of https://github.com/rusty1s/pytorch_scatter/issues/119 (torch_scatter 2.0.3's scatter_softmax, used
# for the attention weights of a GAT, fails in backward with "one of the variables needed for gradient computation has
# been modified by an inplace operation": it takes recentered_scores.exp_() and then divides that result in place with
# .div_(normalizing_constants), overwriting the output that exp saved for its backward; the maintainer's fix (commit
# cf8cf0c, "fix backward pass") uses out-of-place exp() and div(). The library's functions at 2.0.3 with the
# @torch.jit.script decorators dropped and the compiled scatter_max written with torch's scatter_reduce; the issue's
# minimal example as the driver).
from typing import Optional, Tuple

import torch

torch.manual_seed(0)


def broadcast(src: torch.Tensor, other: torch.Tensor, dim: int):  # torch_scatter/utils.py
    if dim < 0:
        dim = other.dim() + dim
    if src.dim() == 1:
        for _ in range(0, dim):
            src = src.unsqueeze(0)
    for _ in range(src.dim(), other.dim()):
        src = src.unsqueeze(-1)
    src = src.expand_as(other)
    return src


def scatter_sum(src: torch.Tensor, index: torch.Tensor, dim: int = -1,
                out: Optional[torch.Tensor] = None,
                dim_size: Optional[int] = None) -> torch.Tensor:  # torch_scatter/scatter.py
    index = broadcast(index, src, dim)
    if out is None:
        size = list(src.size())
        if dim_size is not None:
            size[dim] = dim_size
        elif index.numel() == 0:
            size[dim] = 0
        else:
            size[dim] = int(index.max()) + 1
        out = torch.zeros(size, dtype=src.dtype, device=src.device)
        return out.scatter_add_(dim, index, src)
    else:
        return out.scatter_add_(dim, index, src)


def scatter_max(src: torch.Tensor, index: torch.Tensor, dim: int = -1,
                out: Optional[torch.Tensor] = None,
                dim_size: Optional[int] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:  # compiled op in 2.0.3
    index = broadcast(index, src, dim)
    size = list(src.size())
    size[dim] = dim_size if dim_size is not None else int(index.max()) + 1
    out = torch.zeros(size, dtype=src.dtype).scatter_reduce(dim, index, src, reduce="amax", include_self=False)
    arg = (src == out.gather(dim, index)).nonzero()
    return out, arg


def scatter_softmax(src: torch.Tensor, index: torch.Tensor, dim: int = -1,
                    eps: float = 1e-12) -> torch.Tensor:  # torch_scatter/composite/softmax.py
    if not torch.is_floating_point(src):
        raise ValueError('`scatter_softmax` can only be computed over tensors '
                         'with floating point data types.')

    index = broadcast(index, src, dim)

    max_value_per_index = scatter_max(src, index, dim=dim)[0]
    max_per_src_element = max_value_per_index.gather(dim, index)

    recentered_scores = src - max_per_src_element
    recentered_scores_exp = recentered_scores.exp()

    sum_per_index = scatter_sum(recentered_scores_exp, index, dim)
    normalizing_constants = sum_per_index.add_(eps).gather(dim, index)

    return recentered_scores_exp.div(normalizing_constants)


# Generate src and index tensors
src = torch.randn(6, requires_grad=True)
index = torch.tensor([0, 1, 0, 1, 2, 1])

# Get softmax
softmax_out = scatter_softmax(src, index)

# Sum to allow backward call
out = torch.sum(softmax_out)

# Call backward
out.backward()
print(src.grad)
