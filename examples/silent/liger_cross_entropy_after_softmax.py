"""Liger-Kernel's cross entropy (0.8.5) stores its gradient into its input logits during forward.

After softmax (which saves its output for backward), the earlier layer's gradient is silently wrong in
plain PyTorch. gradguard flags it, names LigerCrossEntropyFunction as the writer, and the clone fix is clean.

    python examples/silent/liger_cross_entropy_after_softmax.py      # CPU: runs Triton's interpreter
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

from liger_kernel.transformers.functional import liger_cross_entropy  # noqa: E402

import gradguard  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
logits = torch.randn(8, 8, device=device, requires_grad=True)
target = torch.randint(0, 8, (8,), device=device)

print("== liger_cross_entropy(softmax(x), target) ==")
try:
    with gradguard.guard():
        p = torch.softmax(logits, dim=-1)
        loss = liger_cross_entropy(p, target)
        loss.backward()
except gradguard.SilentModificationError as error:
    print(error)

print("\n== the fix: liger_cross_entropy(softmax(x).clone(), target) ==")
logits.grad = None
with gradguard.guard() as g:
    p = torch.softmax(logits, dim=-1)
    loss = liger_cross_entropy(p.clone(), target)
    loss.backward()
reference = logits.detach().clone().requires_grad_(True)
torch.nn.functional.cross_entropy(torch.softmax(reference, -1), target).backward()
print(f"findings: {len(g.findings)}; gradient matches torch's cross_entropy: "
      f"{torch.allclose(logits.grad, reference.grad, atol=1e-6)}")
