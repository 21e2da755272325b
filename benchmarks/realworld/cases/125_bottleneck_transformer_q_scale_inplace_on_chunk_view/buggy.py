# Reproduction of https://github.com/lucidrains/bottleneck-transformer-pytorch/pull/14 (bottleneck_transformer_pytorch.py
# before that pull request: Attention.forward scales q with `q *= self.scale` and adds the positional logits with
# `sim += ...`; q is a reshaped view of one output of .chunk(3), and recent PyTorch forbids in-place writes to such
# views. einops' rearrange written with torch reshape/permute; relative position embedding dropped; one BottleStack
# training step on CPU).
import torch
from torch import nn, einsum

torch.manual_seed(0)


# positional embeddings

class AbsPosEmb(nn.Module):
    def __init__(self, fmap_size, dim_head):
        super().__init__()
        scale = dim_head ** -0.5
        self.height = nn.Parameter(torch.randn(fmap_size, dim_head) * scale)
        self.width = nn.Parameter(torch.randn(fmap_size, dim_head) * scale)

    def forward(self, q):
        emb = self.height[:, None, :] + self.width[None, :, :]  # 'h d -> h () d' + 'w d -> () w d'
        emb = emb.reshape(-1, emb.shape[-1])  # 'h w d -> (h w) d'
        logits = einsum('b h i d, j d -> b h i j', q, emb)
        return logits


# classes

class Attention(nn.Module):
    def __init__(self, *, dim, fmap_size, heads=4, dim_head=128):
        super().__init__()
        self.heads = heads
        self.scale = dim_head ** -0.5
        inner_dim = heads * dim_head

        self.to_qkv = nn.Conv2d(dim, inner_dim * 3, 1, bias=False)
        self.pos_emb = AbsPosEmb(fmap_size, dim_head)

    def forward(self, fmap):
        heads, b, c, h, w = self.heads, *fmap.shape

        q, k, v = self.to_qkv(fmap).chunk(3, dim=1)
        # 'b (h d) x y -> b h (x y) d'
        q, k, v = map(lambda t: t.reshape(b, heads, -1, h, w).permute(0, 1, 3, 4, 2).reshape(b, heads, h * w, -1),
                      (q, k, v))

        q *= self.scale

        sim = einsum('b h i d, b h j d -> b h i j', q, k)
        sim += self.pos_emb(q)

        attn = sim.softmax(dim=-1)

        out = einsum('b h i j, b h j d -> b h i d', attn, v)
        out = out.reshape(b, heads, h, w, -1).permute(0, 1, 4, 2, 3).reshape(b, -1, h, w)  # 'b h (x y) d -> b (h d) x y'
        return out


class BottleBlock(nn.Module):
    def __init__(self, *, dim, fmap_size, dim_out, proj_factor, downsample, heads=4, dim_head=128,
                 activation=nn.ReLU()):
        super().__init__()

        # shortcut

        if dim != dim_out or downsample:
            kernel_size, stride, padding = (3, 2, 1) if downsample else (1, 1, 0)

            self.shortcut = nn.Sequential(
                nn.Conv2d(dim, dim_out, kernel_size, stride=stride, padding=padding, bias=False),
                nn.BatchNorm2d(dim_out),
                activation
            )
        else:
            self.shortcut = nn.Identity()

        # contraction and expansion

        attn_dim_in = dim_out // proj_factor
        attn_dim_out = heads * dim_head

        self.net = nn.Sequential(
            nn.Conv2d(dim, attn_dim_in, 1, bias=False),
            nn.BatchNorm2d(attn_dim_in),
            activation,
            Attention(dim=attn_dim_in, fmap_size=fmap_size, heads=heads, dim_head=dim_head),
            nn.AvgPool2d((2, 2)) if downsample else nn.Identity(),
            nn.BatchNorm2d(attn_dim_out),
            activation,
            nn.Conv2d(attn_dim_out, dim_out, 1, bias=False),
            nn.BatchNorm2d(dim_out)
        )

        # init last batch norm gamma to zero

        nn.init.zeros_(self.net[-1].weight)

        # final activation

        self.activation = activation

    def forward(self, x):
        shortcut = self.shortcut(x)
        x = self.net(x)
        x += shortcut
        return self.activation(x)


# main bottle stack

class BottleStack(nn.Module):
    def __init__(self, *, dim, fmap_size, dim_out=2048, proj_factor=4, num_layers=3, heads=4, dim_head=128,
                 downsample=True, activation=nn.ReLU()):
        super().__init__()
        self.dim = dim
        self.fmap_size = fmap_size

        layers = []

        for i in range(num_layers):
            is_first = i == 0
            dim = (dim if is_first else dim_out)
            layer_downsample = is_first and downsample
            layer_fmap_size = fmap_size // (2 if downsample and not is_first else 1)

            layers.append(BottleBlock(dim=dim, fmap_size=layer_fmap_size, dim_out=dim_out, proj_factor=proj_factor,
                                      heads=heads, dim_head=dim_head, downsample=layer_downsample,
                                      activation=activation))

        self.net = nn.Sequential(*layers)

    def forward(self, x):
        _, c, h, w = x.shape
        assert c == self.dim, f'channels of feature map {c} must match channels given at init {self.dim}'
        assert h == self.fmap_size and w == self.fmap_size, f'height and width ({h} {w}) of feature map must match the fmap_size given at init {self.fmap_size}'
        return self.net(x)


layer = BottleStack(dim=8, fmap_size=8, dim_out=16, proj_factor=2, num_layers=2, heads=2, dim_head=8,
                    downsample=True)
optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)
fmap = torch.randn(2, 8, 8, 8)

optimizer.zero_grad()
loss = layer(fmap).pow(2).mean()
loss.backward()
optimizer.step()
print(loss.item())
