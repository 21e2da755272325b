import os

# Triton kernels run on CPU only under the interpreter, and @triton.jit reads this at decoration time,
# so it must be set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
