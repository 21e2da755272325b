"""A C++ extension (torch.utils.cpp_extension.load_inline) that writes through ``data_ptr``: no version bump.

Built once per source hash under the temp dir, so later runs only load it (the first build takes ~30-60 s).
"""

import fcntl
import hashlib
import os
import tempfile

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>

// Scales a float tensor in place through its raw pointer, the way CUDA/C++ kernels write memory.
void scale_inplace(torch::Tensor x, double s) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat, "contiguous float32 expected");
  float* p = x.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<float>(p[i] * s);
}

// The same kernel registered as a torch op whose schema does not declare the write (no Tensor(a!)).
TORCH_LIBRARY(gradguard_silent_test, m) {
  m.def("scale_inplace(Tensor x, float s) -> ()");
}
TORCH_LIBRARY_IMPL(gradguard_silent_test, CPU, m) {
  m.impl("scale_inplace", &scale_inplace);
}
"""


def load():
    digest = hashlib.sha256((SOURCE + torch.__version__).encode()).hexdigest()[:16]
    build = os.path.join(tempfile.gettempdir(), f"gradguard-ext-{digest}")
    os.makedirs(build, exist_ok=True)
    with open(os.path.join(build, "build.flock"), "w") as held:
        # Builders queue here, so a `lock` file torch's baton left behind (a killed build) is stale.
        fcntl.flock(held, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(build, "lock")):
            os.remove(os.path.join(build, "lock"))
        return load_inline(name=f"gradguard_silent_ext_{digest}", cpp_sources=[SOURCE], functions=["scale_inplace"],
                           build_directory=build, extra_cflags=["-O1"], verbose=False)
