# Reproduction of https://github.com/lucidrains/x-transformers/pull/55 (a user stacks x-transformers'
# ContinuousTransformerWrapper(attn_layers=Encoder(...)) on top of an nn.LSTM; loss.backward() fails with "one of the
# variables needed for gradient computation has been modified by an inplace operation ... output 0 of
# CudnnRnnBackward": with dim_in unset, project_in is nn.Identity, so `x += self.pos_emb(x)` adds the positional
# embedding in place into the LSTM's output, which the RNN kernel saved for its backward. The pull request replaces
# it by x = x + self.pos_emb(x). x_transformers.py at the parent of that pull request, shrunk to the classes the
# report uses (Attention without the talking-heads / collab / memory / rotary options, AttentionLayers with the
# default ('a', 'f') pre-norm block); einops' rearrange written as view/transpose; the user's model and loss as in
# the report, smaller; CPU (the fused CPU LSTM, MkldnnRnnLayer, saves its output like cuDNN does)).
import torch
from torch import nn, einsum
import torch.nn.functional as F
from functools import partial
from collections import namedtuple

torch.manual_seed(0)

DEFAULT_DIM_HEAD = 64

Intermediates = namedtuple('Intermediates', [
    'pre_softmax_attn',
    'post_softmax_attn'
])

LayerIntermediates = namedtuple('Intermediates', [
    'hiddens',
    'attn_intermediates'
])


def exists(val):
    return val is not None


def default(val, d):
    if exists(val):
        return val
    return d() if callable(d) else d


def max_neg_value(tensor):
    return -torch.finfo(tensor.dtype).max


class AbsolutePositionalEmbedding(nn.Module):
    def __init__(self, dim, max_seq_len):
        super().__init__()
        self.emb = nn.Embedding(max_seq_len, dim)
        self.init_()

    def init_(self):
        nn.init.normal_(self.emb.weight, std = 0.02)

    def forward(self, x):
        n = torch.arange(x.shape[1], device = x.device)
        return self.emb(n)[None, :, :]


class Residual(nn.Module):
    def forward(self, x, residual):
        return x + residual


class FeedForward(nn.Module):
    def __init__(self, dim, dim_out = None, mult = 4, dropout = 0.):
        super().__init__()
        inner_dim = int(dim * mult)
        dim_out = default(dim_out, dim)
        project_in = nn.Sequential(
            nn.Linear(dim, inner_dim),
            nn.GELU()
        )

        self.net = nn.Sequential(
            project_in,
            nn.Dropout(dropout),
            nn.Linear(inner_dim, dim_out)
        )

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim, dim_head = DEFAULT_DIM_HEAD, heads = 8, causal = False, dropout = 0.):
        super().__init__()
        self.scale = dim_head ** -0.5
        self.heads = heads
        self.causal = causal

        qk_dim = v_dim = dim_head * heads

        self.to_q = nn.Linear(dim, qk_dim, bias = False)
        self.to_k = nn.Linear(dim, qk_dim, bias = False)
        self.to_v = nn.Linear(dim, v_dim, bias = False)

        self.dropout = nn.Dropout(dropout)
        self.attn_fn = F.softmax
        self.to_out = nn.Linear(v_dim, dim)

    def forward(self, x, context = None, mask = None, prev_attn = None):
        b, n, _, h, device = *x.shape, self.heads, x.device
        kv_input = default(context, x)

        q = self.to_q(x)
        k = self.to_k(kv_input)
        v = self.to_v(kv_input)

        # rearrange(t, 'b n (h d) -> b h n d', h = h)
        q, k, v = map(lambda t: t.view(t.shape[0], t.shape[1], h, -1).transpose(1, 2), (q, k, v))

        input_mask = None
        if exists(mask):
            q_mask = mask[:, None, :, None]
            k_mask = mask[:, None, None, :]
            input_mask = q_mask * k_mask

        dots = einsum('b h i d, b h j d -> b h i j', q, k) * self.scale
        mask_value = max_neg_value(dots)

        if exists(prev_attn):
            dots = dots + prev_attn

        pre_softmax_attn = dots.clone()

        if exists(input_mask):
            dots.masked_fill_(~input_mask, mask_value)
            del input_mask

        attn = self.attn_fn(dots, dim = -1)
        post_softmax_attn = attn.clone()

        attn = self.dropout(attn)

        out = einsum('b h i j, b h j d -> b h i d', attn, v)
        out = out.transpose(1, 2).reshape(b, n, -1)  # rearrange(out, 'b h n d -> b n (h d)')

        intermediates = Intermediates(
            pre_softmax_attn = pre_softmax_attn,
            post_softmax_attn = post_softmax_attn
        )

        return self.to_out(out), intermediates


class AttentionLayers(nn.Module):
    def __init__(self, dim, depth, heads = 8, causal = False, pre_norm = True, attn_dim_head = DEFAULT_DIM_HEAD):
        super().__init__()
        self.dim = dim
        self.depth = depth
        self.layers = nn.ModuleList([])

        self.has_pos_emb = False
        self.pre_norm = pre_norm

        norm_fn = partial(nn.LayerNorm, dim)

        default_block = ('a', 'f')
        layer_types = default_block * depth

        self.layer_types = layer_types
        self.num_attn_layers = len(list(filter(lambda t: t == 'a', layer_types)))

        for layer_type in self.layer_types:
            if layer_type == 'a':
                layer = Attention(dim, dim_head = attn_dim_head, heads = heads, causal = causal)
            elif layer_type == 'f':
                layer = FeedForward(dim)
            else:
                raise Exception(f'invalid layer type {layer_type}')

            residual_fn = Residual()

            self.layers.append(nn.ModuleList([
                norm_fn(),
                layer,
                residual_fn
            ]))

    def forward(self, x, context = None, mask = None, mems = None, return_hiddens = False):
        hiddens = []
        intermediates = []
        prev_attn = None

        for ind, (layer_type, (norm, block, residual_fn)) in enumerate(zip(self.layer_types, self.layers)):
            is_last = ind == (len(self.layers) - 1)

            if layer_type == 'a':
                hiddens.append(x)

            residual = x

            if self.pre_norm:
                x = norm(x)

            if layer_type == 'a':
                out, inter = block(x, mask = mask, prev_attn = prev_attn)
            elif layer_type == 'f':
                out = block(x)

            x = residual_fn(out, residual)

            if layer_type == 'a':
                intermediates.append(inter)

            if not self.pre_norm and not is_last:
                x = norm(x)

        if return_hiddens:
            intermediates = LayerIntermediates(
                hiddens = hiddens,
                attn_intermediates = intermediates
            )

            return x, intermediates

        return x


class Encoder(AttentionLayers):
    def __init__(self, **kwargs):
        assert 'causal' not in kwargs, 'cannot set causality on encoder'
        super().__init__(causal = False, **kwargs)


class ContinuousTransformerWrapper(nn.Module):
    def __init__(self, *, max_seq_len, attn_layers, dim_in = None, dim_out = None, emb_dropout = 0., use_pos_emb = True):
        super().__init__()
        assert isinstance(attn_layers, AttentionLayers), 'attention layers must be one of Encoder or Decoder'

        dim = attn_layers.dim

        self.max_seq_len = max_seq_len

        self.pos_emb = AbsolutePositionalEmbedding(dim, max_seq_len)
        self.emb_dropout = nn.Dropout(emb_dropout)

        self.project_in = nn.Linear(dim_in, dim) if exists(dim_in) else nn.Identity()

        self.attn_layers = attn_layers
        self.norm = nn.LayerNorm(dim)

        self.project_out = nn.Linear(dim, dim_out) if exists(dim_out) else nn.Identity()

    def forward(self, x, return_embeddings = False, mask = None, return_attn = False, mems = None, **kwargs):
        b, n, _, device = *x.shape, x.device

        x = self.project_in(x)
        x += self.pos_emb(x)
        x = self.emb_dropout(x)

        x, intermediates = self.attn_layers(x, mask = mask, mems = mems, return_hiddens = True, **kwargs)
        x = self.norm(x)

        out = self.project_out(x) if not return_embeddings else x

        if return_attn:
            attn_maps = list(map(lambda t: t.post_softmax_attn, intermediates.attn_intermediates))
            return out, attn_maps

        return out


# the user's model (from the pull request)
class Model(nn.Module):
    def __init__(self, ):
        super().__init__()
        self.rnn = nn.LSTM(input_size=16, hidden_size=16, num_layers=1,
                           bidirectional=False, batch_first=True)
        self.transformer = ContinuousTransformerWrapper(
            max_seq_len=100,
            attn_layers=Encoder(
                dim=16,
                depth=1,
                heads=2,
                attn_dim_head=8
            )
        )

    def forward(self, x):
        x, _ = self.rnn(x)
        x = self.transformer(x)
        return x


m = Model()

x = torch.randn((2, 6, 16))
loss = m(x).sum()
loss.backward()
print('grad norm of rnn.weight_ih_l0:', m.rnn.weight_ih_l0.grad.norm().item())
