# Code that matches PyTorch's own message keeps working: gradguard's error starts with PyTorch's sentence.
import torch

x = torch.ones(3, requires_grad=True)
y = torch.sigmoid(x)
y.mul_(2)
try:
    y.sum().backward()
except RuntimeError as error:
    print("matched", "modified by an inplace operation" in str(error))
