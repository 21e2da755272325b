"""Per-branch gradient clipping with a tensor hook that clamps its argument in place.

``register_hook(lambda grad: grad.clamp_(-val, val))`` is a common clipping idiom. PyTorch's documentation:
"The hook should not modify its argument"; apaszke in pytorch/pytorch#1110: "never modify the grads received
in the arguments in place!", and in #11165: "Hooks should generally never modify their arguments, but we're not
checking for that"; FDecaYed there: "Trying to modify grad in-place with hook will modify all grads sharing the
buffer". On a residual branch the add shares one gradient between branch and skip path: the skip path is
silently clipped too (this script prints the comparison).

    gradguard run examples/hygiene/04_hook_clamp_residual_buggy.py
"""

import torch

torch.manual_seed(0)
stem = torch.nn.Linear(6, 6)
branch = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh())
x = torch.randn(5, 6)

h = stem(x)
update = branch(h)
update.register_hook(lambda grad: grad.clamp_(-0.01, 0.01))
(h + update).mul(10).sum().backward()

# the same step with a hook that returns a new tensor: what the gradient should be
stem_ref = torch.nn.Linear(6, 6)
branch_ref = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh())
stem_ref.load_state_dict(stem.state_dict())
branch_ref.load_state_dict(branch.state_dict())
h_ref = stem_ref(x)
update_ref = branch_ref(h_ref)
update_ref.register_hook(lambda grad: grad.clamp(-0.01, 0.01))
(h_ref + update_ref).mul(10).sum().backward()
print("stem grad matches a hook returning a new tensor:", torch.allclose(stem.weight.grad, stem_ref.weight.grad))
