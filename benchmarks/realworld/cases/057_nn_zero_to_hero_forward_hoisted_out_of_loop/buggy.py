# Reproduction of https://github.com/karpathy/nn-zero-to-hero/issues/31 (makemore part 1): the reporter's forward pass,
# computed once, with the backward pass and update repeated (read as: the forward was hoisted out of the loop).
import torch
import torch.nn.functional as F

g = torch.Generator().manual_seed(2147483647)
xs = torch.tensor([0, 5, 13, 13, 1])
ys = torch.tensor([5, 13, 13, 1, 0])
xenc = F.one_hot(xs, num_classes=27).float()
W = torch.randn((27, 27), generator=g, requires_grad=True)

#Forward Pass
logits = (xenc @ W)
counts = logits.exp()
prob = counts/counts.sum(1,keepdim=True)
loss = - prob[torch.arange(5),ys].log().mean()
print(loss.item())

for k in range(3):
    #Backward Pass
    W.grad=None
    loss.backward()

    #update the weights
    W.data += -0.1 * W.grad
print(loss.item())
