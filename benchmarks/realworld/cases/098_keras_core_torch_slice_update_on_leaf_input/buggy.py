# Reproduction of https://github.com/keras-team/keras-core/pull/405 (keras_core/backend/torch/core.py before that pull
# request: slice_update writes the updates into its input tensor, which fails when gradients are needed for the
# input; the backend helpers shrunk to the CPU path, the slices made a tuple as current torch wants, and a gradient
# taken through the op with respect to its input and its updates).
import builtins

import numpy as np
import torch

torch.manual_seed(0)

TORCH_DTYPES = {"float32": torch.float32, "int32": torch.int32, "int64": torch.int64}


def to_torch_dtype(dtype):
    if dtype in [value for key, value in TORCH_DTYPES.items()]:
        return dtype
    dtype = TORCH_DTYPES.get(dtype, None)
    if dtype is None:
        raise ValueError(f"Unsupported dtype for PyTorch: {dtype}")
    return dtype


def convert_to_tensor(x, dtype=None):
    dtype = to_torch_dtype(dtype or getattr(x, "dtype", None) or "float32")
    if isinstance(x, int):
        dtype = torch.int32
    if isinstance(x, float):
        dtype = torch.float32
    if torch.is_tensor(x):
        if dtype and dtype != x.dtype:
            x = x.to(dtype)
        return x.to("cpu")
    if not isinstance(x, (list, tuple)):
        x = np.array(x)
    return torch.as_tensor(x, dtype=dtype, device="cpu")


def slice_update(inputs, start_indices, updates):
    shape_dtype = to_torch_dtype("int64")
    inputs = convert_to_tensor(inputs)
    start_indices = convert_to_tensor(start_indices).to(shape_dtype)
    updates = convert_to_tensor(updates)

    python_slice = builtins.slice
    slices = tuple(
        python_slice(start_index, start_index + update_length)
        for start_index, update_length in zip(start_indices, updates.shape)
    )
    inputs[slices] = updates
    return inputs


# The gradient of slice_update with respect to its inputs and its updates.
inputs = torch.randn(4, 5, requires_grad=True)
updates = torch.randn(2, 3, requires_grad=True)
outputs = slice_update(inputs, [1, 2], updates)
loss = (outputs ** 2).sum()
loss.backward()
print(inputs.grad.sum().item(), updates.grad.sum().item())
