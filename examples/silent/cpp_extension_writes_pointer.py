"""A C++ extension that scales a tensor in place through data_ptr(): no version bump, wrong gradients.

    python examples/silent/cpp_extension_writes_pointer.py           # compiles once (~1 min) with g++
"""

import fcntl
import hashlib
import os
import tempfile

import torch
from torch.utils.cpp_extension import load_inline

import gradguard
from gradguard.backends.torch.bisect import bisect

SOURCE = r"""
#include <torch/extension.h>
void scale_inplace(torch::Tensor x, double s) {
  float* p = x.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<float>(p[i] * s);
}
"""
digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
build = os.path.join(tempfile.gettempdir(), f"gradguard-example-ext-{digest}")
os.makedirs(build, exist_ok=True)
with open(os.path.join(build, "build.flock"), "w") as held:
    # Builders of this directory queue here, so a `lock` file torch's own baton left behind (a build killed
    # midway) is stale, and torch would wait on it forever.
    fcntl.flock(held, fcntl.LOCK_EX)
    if os.path.exists(os.path.join(build, "lock")):
        os.remove(os.path.join(build, "lock"))
    ext = load_inline(name=f"gg_example_{digest}", cpp_sources=[SOURCE], functions=["scale_inplace"],
                      build_directory=build)


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ext.scale_inplace(x.detach(), 2.0)  # bug: writes the caller's tensor
        return x.detach().sum()

    @staticmethod
    def backward(ctx, g):
        return g.expand(6)


x = torch.linspace(-1, 1, 6, requires_grad=True)
print("== inside a custom autograd.Function: the Function is named ==")
try:
    with gradguard.guard():
        h = x.tanh()
        (Doubled.apply(h) + h.sum()).backward()
except gradguard.SilentModificationError as error:
    print(error)


def bare():
    h = x.sigmoid()
    y = h.sum()
    ext.scale_inplace(h.detach(), 2.0)  # called directly: no boundary sees it
    z = y * 1.0
    z.backward()


print("\n== called directly: bisect mode names the interval of lines ==")
for finding in bisect(bare):
    print(finding)
