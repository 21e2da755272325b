# Reproduction of https://github.com/huggingface/transformers/issues/40488 (LoRA fine-tuning of Voxtral with PEFT
# fails with "a leaf Variable that requires grad is being used in an in-place operation" at
# inputs_embeds[audio_token_mask] = audio_embeds in VoxtralForConditionalGeneration.forward (transformers 4.55.4):
# the text embedding is frozen by get_peft_model, and the enable_input_require_grads() forward hook (installed when
# training with gradient checkpointing) calls output.requires_grad_(True) on the embedding output, so inputs_embeds
# is a leaf that requires grad. The fix (pull request #40671) clones inputs_embeds before writing the audio
# embeddings. modeling_voxtral.py's encoder / projector / forward at 4.55.4, shrunk (one encoder layer, tiny sizes);
# the Llama language model reduced to one decoder layer; PEFT's LoRA Linear and get_peft_model reduced to what they do
# here (freeze the base model, wrap q_proj / v_proj); transformers' enable_input_require_grads hook written out;
# random mel features and token ids instead of the processor's output).
import math
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)


class VoxtralEncoderConfig:
    d_model = 16
    encoder_attention_heads = 2
    encoder_ffn_dim = 32
    encoder_layers = 1
    num_mel_bins = 8
    max_source_positions = 8
    intermediate_size = 64  # 4 * d_model: four encoder frames make one audio token


class TextConfig:
    vocab_size = 40
    hidden_size = 32
    intermediate_size = 64
    num_attention_heads = 2


class VoxtralConfig:
    audio_config = VoxtralEncoderConfig()
    text_config = TextConfig()
    audio_token_id = 24


class VoxtralAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=True)

    def _shape(self, tensor, seq_len, bsz):
        return tensor.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, hidden_states):
        bsz, tgt_len, _ = hidden_states.size()
        query_states = self._shape(self.q_proj(hidden_states) * self.scaling, tgt_len, bsz)
        key_states = self._shape(self.k_proj(hidden_states), -1, bsz)
        value_states = self._shape(self.v_proj(hidden_states), -1, bsz)
        attn_weights = nn.functional.softmax(torch.matmul(query_states, key_states.transpose(2, 3)), dim=-1)
        attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(bsz, tgt_len, -1).contiguous()
        return self.out_proj(attn_output)


class VoxtralEncoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_dim = config.d_model
        self.self_attn = VoxtralAttention(self.embed_dim, config.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim)
        self.activation_fn = nn.GELU()
        self.fc1 = nn.Linear(self.embed_dim, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, self.embed_dim)
        self.final_layer_norm = nn.LayerNorm(self.embed_dim)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states = self.self_attn(hidden_states)
        hidden_states = residual + hidden_states

        residual = hidden_states
        hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = self.fc2(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class VoxtralEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        embed_dim = config.d_model
        self.config = config
        self.num_mel_bins = config.num_mel_bins
        self.max_source_positions = config.max_source_positions

        self.conv1 = nn.Conv1d(self.num_mel_bins, embed_dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(embed_dim, embed_dim, kernel_size=3, stride=2, padding=1)

        self.embed_positions = nn.Embedding(self.max_source_positions, embed_dim)
        self.embed_positions.requires_grad_(False)

        self.layers = nn.ModuleList([VoxtralEncoderLayer(config) for _ in range(config.encoder_layers)])
        self.layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, input_features):
        expected_seq_length = self.config.max_source_positions * self.conv1.stride[0] * self.conv2.stride[0]
        if input_features.shape[-1] != expected_seq_length:
            raise ValueError(f"Voxtral expects the mel input features to be of length {expected_seq_length}")

        inputs_embeds = nn.functional.gelu(self.conv1(input_features))
        inputs_embeds = nn.functional.gelu(self.conv2(inputs_embeds))
        inputs_embeds = inputs_embeds.permute(0, 2, 1)

        embed_pos = self.embed_positions.weight
        hidden_states = (inputs_embeds + embed_pos).to(inputs_embeds.dtype)

        for encoder_layer in self.layers:
            hidden_states = encoder_layer(hidden_states)

        hidden_states = self.layer_norm(hidden_states)
        return hidden_states  # BaseModelOutput.last_hidden_state


class VoxtralMultiModalProjector(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.linear_1 = nn.Linear(config.audio_config.intermediate_size, config.text_config.hidden_size, bias=False)
        self.act = nn.GELU()
        self.linear_2 = nn.Linear(config.text_config.hidden_size, config.text_config.hidden_size, bias=False)

    def forward(self, audio_features):
        hidden_states = self.linear_1(audio_features)
        hidden_states = self.act(hidden_states)
        hidden_states = self.linear_2(hidden_states)
        return hidden_states


class LlamaDecoderLayer(nn.Module):  # the language model, reduced to one causal decoder layer
    def __init__(self, config):
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)
        self.gate_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, h, bias=False)
        self.input_layernorm = nn.RMSNorm(h)
        self.post_attention_layernorm = nn.RMSNorm(h)

    def forward(self, hidden_states):
        b, n, h = hidden_states.shape
        residual = hidden_states
        x = self.input_layernorm(hidden_states)
        q, k, v = (p(x).view(b, n, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        hidden_states = residual + self.o_proj(attn.transpose(1, 2).reshape(b, n, h))
        residual = hidden_states
        x = self.post_attention_layernorm(hidden_states)
        return residual + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config)])
        self.norm = nn.RMSNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def get_input_embeddings(self):
        return self.embed_tokens

    def forward(self, inputs_embeds, labels=None):
        hidden_states = inputs_embeds
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        logits = self.lm_head(self.norm(hidden_states))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100)
        return loss, logits


class VoxtralForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.vocab_size = config.text_config.vocab_size
        self.audio_tower = VoxtralEncoder(config.audio_config)
        self.language_model = LlamaForCausalLM(config.text_config)
        self.multi_modal_projector = VoxtralMultiModalProjector(config)

    def get_input_embeddings(self):
        return self.language_model.get_input_embeddings()

    def enable_input_require_grads(self):  # transformers.PreTrainedModel.enable_input_require_grads
        def make_inputs_require_grads(module, input, output):
            output.requires_grad_(True)

        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(make_inputs_require_grads)

    def get_audio_embeds(self, input_features):
        audio_outputs = self.audio_tower(input_features)
        audio_hidden_states = audio_outputs
        audio_hidden_states = audio_hidden_states.reshape(-1, self.config.audio_config.intermediate_size)
        audio_embeds = self.multi_modal_projector(audio_hidden_states)
        return audio_embeds

    def forward(self, input_ids=None, input_features=None, inputs_embeds=None, labels=None):
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)

        if input_features is not None:
            audio_embeds = self.get_audio_embeds(input_features)

            # replace text-audio token placeholders with audio embeddings
            audio_token_mask = input_ids == self.config.audio_token_id
            if inputs_embeds.is_leaf and inputs_embeds.requires_grad:
                inputs_embeds = inputs_embeds.clone()
            inputs_embeds[audio_token_mask] = audio_embeds

        return self.language_model(inputs_embeds=inputs_embeds, labels=labels)


class LoraLinear(nn.Module):  # peft.tuners.lora.Linear, one adapter
    def __init__(self, base_layer, r=4, lora_alpha=8):
        super().__init__()
        self.base_layer = base_layer
        self.lora_A = nn.Linear(base_layer.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base_layer.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = lora_alpha / r

    def forward(self, x):
        result = self.base_layer(x)
        result = result + self.lora_B(self.lora_A(x)) * self.scaling
        return result


def get_peft_model(model, target_modules):  # freeze the base model, wrap the target Linear layers
    for p in model.parameters():
        p.requires_grad_(False)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in target_modules and isinstance(child, nn.Linear):
                setattr(module, name, LoraLinear(child))
    return model


config = VoxtralConfig()
model = VoxtralForConditionalGeneration(config)
model.enable_input_require_grads()  # done by PEFT / the Trainer when gradient checkpointing is on
model = get_peft_model(model, target_modules=["q_proj", "v_proj"])
model.language_model.train()
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

batch_size = 2
input_features = torch.randn(batch_size, config.audio_config.num_mel_bins, 16)  # log-mel, padded
audio_tokens_per_sample = 2
input_ids = torch.randint(1, 20, (batch_size, 7))
input_ids[:, 1:1 + audio_tokens_per_sample] = config.audio_token_id  # [BOS, <audio> <audio>, text...]
labels = input_ids.clone()
labels[:, :1 + audio_tokens_per_sample] = -100

for step in range(2):
    optimizer.zero_grad()
    loss, logits = model(input_ids=input_ids, input_features=input_features, labels=labels)
    loss.backward()
    optimizer.step()
    print('step', step, 'loss', loss.item())
