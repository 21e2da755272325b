# Reproduction of https://github.com/vllm-project/compressed-tensors/pull/580 (src/compressed_tensors/offload/__init__.py
# before that pull request: update_offload_parameter copies new data into a module's parameter in place with grad
# mode on, which fails for parameters that require grad, as in gradient-based calibration such as AutoRound; the
# offload cache reduced to its type, the caller a short signed-rounding calibration of one Linear layer).
import torch

torch.manual_seed(0)


class OffloadCache(dict):
    """Stands for compressed_tensors.offload.cache.OffloadCache (the parameters of an offloaded module)."""


def update_offload_parameter(module: torch.nn.Module, name: str, data: torch.Tensor):
    """
    Update the offload and onload data of an existing parameter/buffer. Supports both
    parameters of both offloaded modules and non-offloaded modules.
    """
    if isinstance(module._parameters, OffloadCache):
        setattr(module, name, torch.nn.Parameter(data.data, requires_grad=False))

    else:
        getattr(module, name).copy_(data)


def round_ste(x):
    return (x.round() - x).detach() + x


def quantize_dequantize(weight, scale, v):
    return torch.clamp(round_ste(weight / scale + v), -8, 7) * scale


# Calibrate the rounding of one Linear layer (learnable offsets v), then write the quantized weight back.
layer = torch.nn.Linear(8, 8)
calib_inputs = torch.randn(16, 8)
with torch.no_grad():
    reference = layer(calib_inputs)
scale = layer.weight.detach().abs().amax(dim=1, keepdim=True) / 7
v = torch.zeros_like(layer.weight, requires_grad=True)
optimizer = torch.optim.SGD([v], lr=1e-3)
for step in range(3):
    qdq_weight = quantize_dequantize(layer.weight.detach(), scale, v)
    loss = torch.nn.functional.mse_loss(torch.nn.functional.linear(calib_inputs, qdq_weight, layer.bias), reference)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

update_offload_parameter(layer, "weight", quantize_dequantize(layer.weight.detach(), scale, v.detach()))
print(loss.item(), layer.weight.abs().sum().item())
