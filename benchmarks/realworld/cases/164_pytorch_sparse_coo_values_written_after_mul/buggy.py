# Reproduction of https://github.com/pytorch/pytorch/issues/22778 (a PyTorch issue, still open: a sparse COO tensor
# built with torch.sparse_coo_tensor(ind, values) shares memory with `values`, but an in-place update of `values`
# does not bump the version counter the sparse tensor's values carry, so after d = c.mul(c) saved c for backward,
# values.add_(1) changes c without any error and d.backward(grad) returns a gradient computed from the new value.
# The snippet as written, plus a print of the gradient and the one expected).
import torch

torch.manual_seed(0)

ind = torch.tensor([[0],[1]]).add_(1).sub_(1)
values = torch.tensor([1.]).add_(1).add_(1).sub_(1).sub_(1)
c = torch.sparse_coo_tensor(ind, values).requires_grad_()
grad = torch.sparse_coo_tensor(ind.clone(), values.clone())
d = c.mul(c)
values.add_(1)
d.backward(grad)  # This should have thrown an error saying there is version mismatch error for c

print("c.grad values:", c.grad.coalesce().values())  # 2 * c * grad = 2 * 1 * 1 = 2 expected
