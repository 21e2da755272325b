# Reproduction of the "What about .data?" example of https://pytorch.org/blog/pytorch-0_4_0-migration-guide/
import torch

a = torch.tensor([1,2,3.], requires_grad = True)
out = a.sigmoid()
c = out.detach().clone()
c.zero_()
out.sum().backward()
print(a.grad)  # tensor([0., 0., 0.]): wrong, and nothing says so
