"""pytorch-softdtw: after batching support, the backward multiplies a (B,) gradient into a (B, N, M) one.

Report/fix: https://github.com/Sleepwalking/pytorch-softdtw/pull/5 ("When batching support was added in #4 the
multiplication expression was not properly updated to support batches. My local tests didn't catch the issue"):
``grad_output * E`` -> ``grad_output.view(-1, 1, 1).expand_as(E) * E`` (commit 300fcb0).
Code:   soft_dtw.py at 300fcb0^ (MIT), verbatim except that numba's ``@jit`` is dropped (same loops in Python).
"""

import numpy as np
import torch
from torch.autograd import Function

CASE = {
    "library": "pytorch-softdtw (Sep 2019)",
    "kind": "backward (NumPy)",
    "report": "https://github.com/Sleepwalking/pytorch-softdtw/pull/5",
    "fix": "https://github.com/Sleepwalking/pytorch-softdtw/commit/300fcb0",
    "code": "verbatim at 300fcb0^, numba @jit dropped",
    "root_cause": ("op.raised", "gradient."),
    "without_reference": "caught",
    "known_defects": (),
}


def compute_softdtw(D, gamma):
    B = D.shape[0]
    N = D.shape[1]
    M = D.shape[2]
    R = np.ones((B, N + 2, M + 2)) * np.inf
    R[:, 0, 0] = 0
    for k in range(B):
        for j in range(1, M + 1):
            for i in range(1, N + 1):
                r0 = -R[k, i - 1, j - 1] / gamma
                r1 = -R[k, i - 1, j] / gamma
                r2 = -R[k, i, j - 1] / gamma
                rmax = max(max(r0, r1), r2)
                rsum = np.exp(r0 - rmax) + np.exp(r1 - rmax) + np.exp(r2 - rmax)
                softmin = - gamma * (np.log(rsum) + rmax)
                R[k, i, j] = D[k, i - 1, j - 1] + softmin
    return R


def compute_softdtw_backward(D_, R, gamma):
    B = D_.shape[0]
    N = D_.shape[1]
    M = D_.shape[2]
    D = np.zeros((B, N + 2, M + 2))
    E = np.zeros((B, N + 2, M + 2))
    D[:, 1:N + 1, 1:M + 1] = D_
    E[:, -1, -1] = 1
    R[:, :, -1] = -np.inf
    R[:, -1, :] = -np.inf
    R[:, -1, -1] = R[:, -2, -2]
    for k in range(B):
        for j in range(M, 0, -1):
            for i in range(N, 0, -1):
                a0 = (R[k, i + 1, j] - R[k, i, j] - D[k, i + 1, j]) / gamma
                b0 = (R[k, i, j + 1] - R[k, i, j] - D[k, i, j + 1]) / gamma
                c0 = (R[k, i + 1, j + 1] - R[k, i, j] - D[k, i + 1, j + 1]) / gamma
                a = np.exp(a0)
                b = np.exp(b0)
                c = np.exp(c0)
                E[k, i, j] = E[k, i + 1, j] * a + E[k, i, j + 1] * b + E[k, i + 1, j + 1] * c
    return E[:, 1:N + 1, 1:M + 1]


class _SoftDTW(Function):
    @staticmethod
    def forward(ctx, D, gamma):
        dev = D.device
        dtype = D.dtype
        gamma = torch.Tensor([gamma]).to(dev).type(dtype)  # dtype fixed
        D_ = D.detach().cpu().numpy()
        g_ = gamma.item()
        R = torch.Tensor(compute_softdtw(D_, g_)).to(dev).type(dtype)
        ctx.save_for_backward(D, R, gamma)
        return R[:, -2, -2]

    @staticmethod
    def backward(ctx, grad_output):
        dev = grad_output.device
        dtype = grad_output.dtype
        D, R, gamma = ctx.saved_tensors
        D_ = D.detach().cpu().numpy()
        R_ = R.detach().cpu().numpy()
        g_ = gamma.item()
        E = torch.Tensor(compute_softdtw_backward(D_, R_, g_)).to(dev).type(dtype)
        return grad_output * E, None


class _SoftDTWFixed(_SoftDTW):
    @staticmethod
    def backward(ctx, grad_output):
        dev = grad_output.device
        dtype = grad_output.dtype
        D, R, gamma = ctx.saved_tensors
        D_ = D.detach().cpu().numpy()
        R_ = R.detach().cpu().numpy()
        g_ = gamma.item()
        E = torch.Tensor(compute_softdtw_backward(D_, R_, g_)).to(dev).type(dtype)
        return grad_output.view(-1, 1, 1).expand_as(E) * E, None


def buggy(D):
    return _SoftDTW.apply(D, 1.0)


def fixed(D):
    return _SoftDTWFixed.apply(D, 1.0)


def reference(D, gamma=1.0):
    """Soft-DTW by autograd through the same recursion (logsumexp softmin, no hand-written backward)."""
    B, N, M = D.shape
    inf = torch.full((B,), float("inf"), dtype=D.dtype)
    R = [[None] * (M + 1) for _ in range(N + 1)]
    for i in range(N + 1):
        for j in range(M + 1):
            R[i][j] = torch.zeros(B, dtype=D.dtype) if i == 0 and j == 0 else inf
    for j in range(1, M + 1):
        for i in range(1, N + 1):
            prev = torch.stack([R[i - 1][j - 1], R[i - 1][j], R[i][j - 1]])
            R[i][j] = D[:, i - 1, j - 1] - gamma * torch.logsumexp(-prev / gamma, dim=0)
    return R[N][M]


def inputs():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 4, 2, generator=g), torch.randn(3, 5, 2, generator=g)
    return ((x.unsqueeze(2) - y.unsqueeze(1)).pow(2).sum(3).double(),)  # the module's squared distances, (B, N, M)


OPTIONS = {}
