# Reproduction of https://github.com/ShusenTang/Dive-into-DL-PyTorch/issues/126 (the book's section 2.3.3 example
# "changing x.data is not recorded by autograd, so it does not affect backpropagation", with the reporter's
# y = x ** 2 in place of y = 2 * x: the square saved x, and backward silently uses the scaled value).
import torch

x = torch.ones(1, requires_grad=True)

print(x.data)  # still a tensor
print(x.data.requires_grad)  # but outside the graph

y = x ** 2

y.backward()
x.data *= 100  # only changes the value, not recorded in the graph, so backprop should not be affected
print(x)  # changing data also changes the tensor's value
print(x.grad)  # the gradient of x ** 2 at x = 1 is 2
