"""Cross entropy with ignore_index: the buggy backward forgets ignored rows.

The given targets contain no ignored row, so the bug is invisible on them; check_op reads
``ignore_index=-100`` from the signature and probes the sentinel itself.
"""

import torch

from _show import show
from kernels import cross_entropy, cross_entropy_ignore_bug, cross_entropy_ref

g = torch.Generator().manual_seed(3)
logits, target = torch.randn(6, 5, generator=g), torch.randint(0, 5, (6,), generator=g)
show("cross entropy: correct", cross_entropy, logits, target, reference=cross_entropy_ref)
show("cross entropy: backward ignores ignore_index", cross_entropy_ignore_bug, logits, target, reference=cross_entropy_ref)
