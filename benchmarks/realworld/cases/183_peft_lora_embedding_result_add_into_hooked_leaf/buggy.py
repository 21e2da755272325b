# Reproduction of https://github.com/huggingface/peft/pull/1372 (LoRA on an embedding layer fails with "a leaf Variable
# that requires grad is being used in an in-place operation" at `result += (after_A @ embedding_B) * scaling` in
# peft/tuners/lora/layer.py Embedding.forward; the pull request writes it out of place. The leaf is the frozen base
# embedding's output: the usual QLoRA recipe calls prepare_model_for_kbit_training(model) before get_peft_model, which
# (with gradient checkpointing) installs transformers' enable_input_require_grads forward hook on the input
# embedding; get_peft_model then wraps that nn.Embedding as the LoRA layer's base_layer, so base_layer(x) returns a
# tensor without grad_fn on which the hook set requires_grad=True (huggingface/peft#1553 reports the same error with
# bitsandbytes). LoraLayer / Embedding / Linear forward as in peft 0.7.1, reduced to one adapter; the two peft helpers
# reduced to what they do here; a one-block causal LM instead of the user's model; random token ids).
import math
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)


class TinyCausalLM(nn.Module):
    def __init__(self, vocab_size=50, hidden=32, heads=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden, padding_idx=0)
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)

    def get_input_embeddings(self):
        return self.embed_tokens

    def enable_input_require_grads(self):  # transformers.PreTrainedModel.enable_input_require_grads
        def make_inputs_require_grads(module, input, output):
            output.requires_grad_(True)

        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(make_inputs_require_grads)

    def forward(self, input_ids, labels=None):
        h = self.embed_tokens(input_ids)
        b, n, d = h.shape
        q, k, v = (p(h).view(b, n, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, d)
        h = h + self.o_proj(a)
        logits = self.lm_head(self.norm(h))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
        return loss, logits


class LoraLayer:
    def __init__(self, base_layer):
        self.base_layer = base_layer
        self.r = {}
        self.lora_alpha = {}
        self.scaling = {}
        self.lora_A = nn.ModuleDict({})
        self.lora_B = nn.ModuleDict({})
        self.lora_embedding_A = nn.ParameterDict({})
        self.lora_embedding_B = nn.ParameterDict({})
        self.active_adapters = ["default"]
        self.disable_adapters = False
        self.merged = False


class Linear(nn.Module, LoraLayer):  # peft.tuners.lora.layer.Linear
    def __init__(self, base_layer, adapter_name="default", r=4, lora_alpha=8):
        super().__init__()
        LoraLayer.__init__(self, base_layer)
        self.r[adapter_name] = r
        self.lora_alpha[adapter_name] = lora_alpha
        self.lora_A[adapter_name] = nn.Linear(base_layer.in_features, r, bias=False)
        self.lora_B[adapter_name] = nn.Linear(r, base_layer.out_features, bias=False)
        self.scaling[adapter_name] = lora_alpha / r
        nn.init.kaiming_uniform_(self.lora_A[adapter_name].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B[adapter_name].weight)

    def forward(self, x, *args, **kwargs):
        previous_dtype = x.dtype
        result = self.base_layer(x, *args, **kwargs)
        for active_adapter in self.active_adapters:
            if active_adapter not in self.lora_A.keys():
                continue
            lora_A = self.lora_A[active_adapter]
            lora_B = self.lora_B[active_adapter]
            scaling = self.scaling[active_adapter]
            x = x.to(lora_A.weight.dtype)
            result += lora_B(lora_A(x)) * scaling
        result = result.to(previous_dtype)
        return result


class Embedding(nn.Module, LoraLayer):  # peft.tuners.lora.layer.Embedding
    def __init__(self, base_layer, adapter_name="default", r=4, lora_alpha=8):
        super().__init__()
        LoraLayer.__init__(self, base_layer)
        self.r[adapter_name] = r
        self.lora_alpha[adapter_name] = lora_alpha
        weight_A = torch.randn((r, base_layer.num_embeddings))
        weight_B = torch.randn((base_layer.embedding_dim, r))
        self.lora_embedding_A[adapter_name] = nn.Parameter(weight_A)
        self.lora_embedding_B[adapter_name] = nn.Parameter(weight_B)
        self.scaling[adapter_name] = lora_alpha / r
        nn.init.zeros_(self.lora_embedding_A[adapter_name])
        nn.init.normal_(self.lora_embedding_B[adapter_name])

    def _embed(self, input, weight):
        base_layer = self.base_layer
        return F.embedding(
            input,
            weight,
            padding_idx=base_layer.padding_idx,
            max_norm=base_layer.max_norm,
            norm_type=base_layer.norm_type,
            scale_grad_by_freq=base_layer.scale_grad_by_freq,
            sparse=base_layer.sparse,
        )

    def forward(self, x, *args, **kwargs):
        if self.disable_adapters:
            result = self.base_layer(x, *args, **kwargs)
        elif self.merged:
            result = self.base_layer(x, *args, **kwargs)
        else:
            result = self.base_layer(x, *args, **kwargs)
            for active_adapter in self.active_adapters:
                if active_adapter not in self.lora_embedding_A:
                    continue
                embedding_A = self.lora_embedding_A[active_adapter].T
                embedding_B = self.lora_embedding_B[active_adapter].T
                scaling = self.scaling[active_adapter]
                after_A = self._embed(x, embedding_A)
                result += (after_A @ embedding_B) * scaling

        return result


def prepare_model_for_kbit_training(model, use_gradient_checkpointing=True):  # peft.utils.other, reduced
    for name, param in model.named_parameters():
        # freeze base model's layers
        param.requires_grad = False
    if use_gradient_checkpointing:
        model.enable_input_require_grads()
    return model


def get_peft_model(model, target_modules):  # LoraModel._create_and_replace, reduced
    for name in target_modules:
        target = getattr(model, name)
        new_module = Embedding(target) if isinstance(target, nn.Embedding) else Linear(target)
        setattr(model, name, new_module)
    return model


model = TinyCausalLM()
model = prepare_model_for_kbit_training(model)
model = get_peft_model(model, target_modules=["embed_tokens", "q_proj", "v_proj"])
model.train()
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

input_ids = torch.randint(1, 50, (2, 8))
for step in range(2):
    optimizer.zero_grad()
    loss, _ = model(input_ids, labels=input_ids)
    loss.backward()
    optimizer.step()
    print('step', step, 'loss', loss.item())
