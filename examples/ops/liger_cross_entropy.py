"""liger-kernel's Triton cross entropy (linkedin/Liger-Kernel#272), run on CPU under the Triton interpreter.

The loss and its own gradient are right; its forward stores the gradient into its input without a
version bump, which silently corrupts any producer that saved that tensor (softmax, exp, sigmoid, relu).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before importing any kernel module

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from liger_kernel.transformers.functional import liger_cross_entropy  # noqa: E402

from _show import show  # noqa: E402

g = torch.Generator().manual_seed(0)
logits, target = torch.randn(8, 8, generator=g), torch.randint(0, 8, (8,), generator=g)
show("liger_cross_entropy (0.8.5), full audit", liger_cross_entropy, logits, target, reference=F.cross_entropy)
show("liger_cross_entropy on a clone (the user-side workaround)",
     lambda input, target: liger_cross_entropy(input.clone(), target), logits, target, reference=F.cross_entropy,
     checks=("mutation", "aliasing", "composition"))
