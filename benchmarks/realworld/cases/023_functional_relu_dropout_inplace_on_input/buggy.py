# Reproduction of https://github.com/pytorch/pytorch/issues/727 (snippet as reported).
import torch
import torch.nn as nn
from torch.autograd import Variable
import numpy as np
import torch.nn.functional as F

np.random.seed(0)
x = Variable(torch.from_numpy(np.random.randn(4, 6, 10,10)).float(), requires_grad=True)
x = F.relu(x, inplace=True)
x = F.dropout(x,p=0.1, inplace=True)
result = torch.sum(x)
result.backward()
