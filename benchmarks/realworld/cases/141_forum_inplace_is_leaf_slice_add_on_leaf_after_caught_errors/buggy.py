# Reproduction of https://discuss.pytorch.org/t/inplace-operation-changes-is-leaf-attribute/120297 (the poster's script
# trying six ways to modify a leaf that requires grad: the first four raise RuntimeErrors that the script catches, the
# write through c.detach() is allowed, and the last one, `c[:] += 1`, is an in-place add on a view of the leaf c; the
# poster's PyTorch let it through and turned c into a non-leaf, current PyTorch raises "a view of a leaf Variable that
# requires grad is being used in an in-place operation", uncaught. The poster's code as posted, indentation restored).
import torch

torch.manual_seed(0)

c = torch.randn(10, 3, 2, 32, requires_grad=True)
print(c.is_leaf)
# operation 1
try:
    c += 1  # RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.
except RuntimeError:
    print(RuntimeError)
# operation 2
try:
    torch.add(c, 1, out=c)  # RuntimeError: add(): functions with out=... arguments don't support automatic differentiation, but one of the arguments requires grad. Grad will not be copied (only data will be copied).
except RuntimeError:
    print(RuntimeError)
# operation 3
try:
    c.add_(1)  # RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.
except RuntimeError:
    print(RuntimeError)
# operation 4
try:
    c.index_copy_(3, torch.tensor(10), torch.randn(10, 3, 2, 1))  # RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.
except RuntimeError:
    print(RuntimeError)
# operation 5
d = c.detach()
d += 1  # no error, and still leaf
print(c.is_leaf)
# operation 6
c[:] += 1  # no error, but not leaf anymore
print(c.is_leaf)
