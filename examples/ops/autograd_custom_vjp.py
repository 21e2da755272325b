"""Seed 003's class of op in HIPS autograd: a custom primitive with a hand-written vjp.

A weighted squared distance sum(w * (x - y)**2) over the last axis as one primitive, the way autograd users write a
fast kernel, with a correct vjp and two buggy ones: d/dx forgetting the factor 2 the square brings down, and d/dw
not summed over the batch (a [4, 3] gradient for a [3] weight). autograd checks neither: the first is silently half
the gradient, the second fails somewhere inside autograd's backward without naming w. check_op(backend="autograd")
names the input in both. Exits 1 if check_op fails the correct primitive or does not name the buggy inputs.
"""

import sys

import numpy as np
from autograd.extend import defvjp, primitive

from _show import show


def _vjp_x(ans, x, y, w):
    return lambda g: 2 * g[..., None] * w * (x - y)


def _vjp_y(ans, x, y, w):
    return lambda g: -2 * g[..., None] * w * (x - y)


def _vjp_w(ans, x, y, w):
    return lambda g: (g[..., None] * (x - y) ** 2).reshape(-1, w.size).sum(axis=0)  # summed over the batch


@primitive
def weighted_sq_dist(x, y, w):
    return np.sum(w * (x - y) ** 2, axis=-1)


defvjp(weighted_sq_dist, _vjp_x, _vjp_y, _vjp_w)


@primitive
def weighted_sq_dist_no_factor_2(x, y, w):
    return np.sum(w * (x - y) ** 2, axis=-1)


defvjp(weighted_sq_dist_no_factor_2, lambda ans, x, y, w: lambda g: g[..., None] * w * (x - y), _vjp_y, _vjp_w)


@primitive
def weighted_sq_dist_unreduced_w(x, y, w):
    return np.sum(w * (x - y) ** 2, axis=-1)


defvjp(weighted_sq_dist_unreduced_w, _vjp_x, _vjp_y, lambda ans, x, y, w: lambda g: g[..., None] * (x - y) ** 2)

rng = np.random.default_rng(0)
x, y, w = rng.standard_normal((4, 3)), rng.standard_normal((4, 3)), rng.uniform(0.5, 2.0, 3)
correct = show("correct vjp", weighted_sq_dist, x, y, w, backend="autograd")
no_factor_2 = show("buggy vjp: d/dx forgets the factor 2", weighted_sq_dist_no_factor_2, x, y, w, backend="autograd")
unreduced = show("buggy vjp: d/dw not summed over the batch", weighted_sq_dist_unreduced_w, x, y, w, backend="autograd")


def names(report, check, wrong):
    return report.root_cause is not None and (report.root_cause.check, report.root_cause.input) == (check, wrong)


sys.exit(0 if correct.passed and names(no_factor_2, "gradient.numerical", "x")
         and names(unreduced, "op.raised", "w") else 1)
