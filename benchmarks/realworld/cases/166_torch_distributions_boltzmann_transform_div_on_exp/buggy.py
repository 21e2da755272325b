# Reproduction of https://github.com/pytorch/pytorch/pull/5842 (torch.distributions before that pull request:
# BoltzmannTransform, the transform onto the simplex (later SoftmaxTransform), normalized exp(x - max) in place with
# probs /= probs.sum(-1, True), overwriting the output of exp that exp saved for its backward; the pull request
# replaces it with probs / probs.sum(-1, True) to avoid the "modified by an inplace operation" error in .backward().
# The library's Transform/BoltzmannTransform as they were, driven by a small maximum-likelihood fit of a
# simplex-constrained Categorical parameter (the pull request shows no user code; the fit is filled in)).
import torch
from torch.distributions import Categorical, constraints

torch.manual_seed(0)


class Transform(object):
    """
    Abstract class for invertable transformations with computable log
    det jacobians.
    """
    event_dim = 0

    def __call__(self, x):
        return self._call(x)

    def _call(self, x):
        raise NotImplementedError


class BoltzmannTransform(Transform):
    """
    Transform from unconstrained space to the simplex via `y = exp(x)` then
    normalizing.

    This is not bijective and cannot be used for HMC. However this acts mostly
    coordinate-wise (except for the final normalization), and thus is
    appropriate for coordinate-wise optimization algorithms.
    """
    domain = constraints.real
    codomain = constraints.simplex
    event_dim = 1

    def __eq__(self, other):
        return isinstance(other, BoltzmannTransform)

    def _call(self, x):
        logprobs = x
        probs = (logprobs - logprobs.max(-1, True)[0]).exp()
        probs /= probs.sum(-1, True)
        return probs

    def _inverse(self, y):
        probs = y
        return probs.log()


data = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), 200, replacement=True)
unconstrained = torch.zeros(3, requires_grad=True)
transform = BoltzmannTransform()
optimizer = torch.optim.Adam([unconstrained], lr=0.1)

for step in range(20):
    optimizer.zero_grad()
    probs = transform(unconstrained)
    loss = -Categorical(probs=probs).log_prob(data).mean()
    loss.backward()
    optimizer.step()
print("fitted probs:", transform(unconstrained).detach())
