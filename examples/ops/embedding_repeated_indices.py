"""Embedding backward: index_add (correct) vs plain index assignment (last write wins on repeated indices).

The given indices are distinct, so the bug is invisible on them; check_op repeats indices itself.
padding_idx=0 is declared, so its row is compared against F.embedding's convention (zero gradient).
"""

import torch

from _show import show
from kernels import embedding, embedding_overwrite, embedding_ref

g = torch.Generator().manual_seed(4)
idx, weight = torch.randperm(7, generator=g)[:5], torch.randn(7, 3, generator=g)
show("embedding: correct", embedding, idx, weight, reference=embedding_ref, kwargs=dict(padding_idx=0))
show("embedding: gw[idx] = g instead of index_add", embedding_overwrite, idx, weight, reference=embedding_ref,
     kwargs=dict(padding_idx=0))
