# Reproduction of https://github.com/synsense/sinabs/issues/5 (sinabs/layers/stateful_layer.py before ffae161:
# StatefulLayer.reset_states zeroes each state buffer in place, so the membrane potential keeps the grad_fn of the
# previous batch's graph; the next batch builds on it and its backward reaches the freed graph. The IAF layer and its
# surrogate-gradient spike function written out small; sinabs.utils.reset_states inlined).
from typing import List

import torch
import torch.nn as nn

torch.manual_seed(0)


class SingleSpike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v_mem, spike_threshold):
        ctx.save_for_backward(v_mem)
        ctx.spike_threshold = spike_threshold
        return (v_mem >= spike_threshold).float()

    @staticmethod
    def backward(ctx, grad_output):
        (v_mem,) = ctx.saved_tensors
        surrogate = torch.exp(-(v_mem - ctx.spike_threshold).abs())  # SingleExponential surrogate
        return grad_output * surrogate, None


class StatefulLayer(torch.nn.Module):
    def __init__(self, state_names: List[str]):
        super().__init__()
        for state_name in state_names:
            self.register_buffer(state_name, torch.zeros((0)))

    def is_state_initialised(self) -> bool:
        for buffer in self.buffers():
            if buffer.shape == torch.Size([0]):
                return False
        return True

    def state_has_shape(self, shape) -> bool:
        for buff in self.buffers():
            if buff.shape != shape:
                return False
        return True

    def init_state_with_shape(self, shape, randomize: bool = False) -> None:
        for name, buffer in self.named_buffers():
            self.register_buffer(name, torch.zeros(shape, device=buffer.device))
        self.reset_states(randomize=randomize)

    def reset_states(self, randomize=False):
        """
        Reset the state/buffers in a layer.
        """
        if self.is_state_initialised():
            for buffer in self.buffers():
                if randomize:
                    torch.nn.init.uniform_(buffer)
                else:
                    buffer.zero_()


class IAF(StatefulLayer):
    def __init__(self, spike_threshold: float = 1.0):
        super().__init__(state_names=["v_mem"])
        self.spike_threshold = spike_threshold

    def forward(self, input_data: torch.Tensor):
        batch_size, time_steps, *trailing_dim = input_data.shape
        if not self.is_state_initialised() or not self.state_has_shape((batch_size, *trailing_dim)):
            self.init_state_with_shape((batch_size, *trailing_dim))

        v_mem = self.v_mem
        output_spikes = []
        for step in range(time_steps):
            v_mem = v_mem + input_data[:, step]
            spikes = SingleSpike.apply(v_mem, self.spike_threshold)
            v_mem = v_mem - spikes * self.spike_threshold
            output_spikes.append(spikes)
        self.v_mem = v_mem
        return torch.stack(output_spikes, 1)


def reset_states(model: nn.Module) -> None:
    for layer in model.modules():
        if isinstance(layer, StatefulLayer):
            layer.reset_states()


model = nn.Sequential(nn.Linear(4, 8), IAF(), nn.Linear(8, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for batch in range(2):
    data, target = torch.rand(3, 5, 4) * 2, torch.rand(3, 2)
    reset_states(model)
    optimizer.zero_grad()
    out = model(data).sum(1)
    loss = nn.functional.mse_loss(out, target)
    loss.backward()
    optimizer.step()
print(loss.item())
