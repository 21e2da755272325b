# Reproduction of https://github.com/huggingface/transformers/pull/41535 (modeling_qwen3_vl_moe.py _deepstack_process under
# gradient checkpointing, reentrant; the decoder layer here is a pass-through for the visual tokens).
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)


class DecoderLayer(nn.Module):
    def forward(self, hidden_states):
        return hidden_states


class TextModel(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.embed = nn.Linear(6, dim)
        self.layers = nn.ModuleList([DecoderLayer()])
        self.gradient_checkpointing = True

    def _deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds):
        visual_pos_masks = visual_pos_masks.to(hidden_states.device)
        visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
        local_this = hidden_states[visual_pos_masks, :] + visual_embeds
        hidden_states[visual_pos_masks, :] = local_this
        return hidden_states

    def forward(self, inputs, visual_pos_masks, deepstack_visual_embeds):
        hidden_states = self.embed(inputs)
        for layer_idx, decoder_layer in enumerate(self.layers):
            if self.gradient_checkpointing and self.training:
                hidden_states = checkpoint(decoder_layer, hidden_states, use_reentrant=True)
            else:
                hidden_states = decoder_layer(hidden_states)
            if layer_idx < len(deepstack_visual_embeds):
                hidden_states = self._deepstack_process(hidden_states, visual_pos_masks, deepstack_visual_embeds[layer_idx])
        return hidden_states


model = TextModel()
inputs = torch.randn(5, 6)
visual_pos_masks = torch.tensor([False, True, True, False, False])
deepstack = [torch.randn(2, 8)]
loss = model(inputs, visual_pos_masks, deepstack).pow(2).mean()
loss.backward()
print(loss.item())
