# Reproduction of https://github.com/buggyyang/CDC_compression/issues/1 (training the conditional diffusion image
# compression model fails in loss.backward() with "one of the variables needed for gradient computation has been
# modified by an inplace operation"; the reporter's fix, which the author later committed: replace `h += ...` in
# modules/network_components.py ResnetBlock.forward with `h = h + ...`. The repository's ResnetBlock / Block /
# LinearAttention / Unet and GaussianDiffusion.q_sample / p_losses at the date, shrunk (dim 8, two
# resolutions, 16x16 images); einops.rearrange written as reshape; the entropy-coding context model is replaced by a
# small stand-in that returns one context feature map per resolution, and the Trainer by a short Adam loop).
import numpy as np
import torch
import torch.nn.functional as F
from functools import partial
from torch import nn

torch.manual_seed(0)


def exists(x):
    return x is not None


def default(val, d):
    if exists(val):
        return val
    return d


def extract(a, t, x_shape):
    b, *_ = t.shape
    out = a.gather(-1, t)
    return out.reshape(b, *((1,) * (len(x_shape) - 1)))


def linear_beta_schedule(timesteps):
    scale = 1000 / timesteps
    beta_start = scale * 0.0001
    beta_end = scale * 0.02
    return np.linspace(beta_start, beta_end, timesteps, dtype=np.float64)


# modules/network_components.py

class Residual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, *args, **kwargs):
        return self.fn(x, *args, **kwargs) + x


class Upsample(nn.Module):
    def __init__(self, dim_in, dim_out=None):
        super().__init__()
        if dim_out is None:
            dim_out = dim_in
        self.conv = nn.ConvTranspose2d(dim_in, dim_out, 4, 2, 1)

    def forward(self, x):
        return self.conv(x)


class Downsample(nn.Module):
    def __init__(self, dim_in, dim_out=None):
        super().__init__()
        if dim_out is None:
            dim_out = dim_in
        self.conv = nn.Conv2d(dim_in, dim_out, 3, 2, 1)

    def forward(self, x):
        return self.conv(x)


class LayerNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.ones(1, dim, 1, 1))
        self.b = nn.Parameter(torch.zeros(1, dim, 1, 1))

    def forward(self, x):
        var = torch.var(x, dim=1, unbiased=False, keepdim=True)
        mean = torch.mean(x, dim=1, keepdim=True)
        return (x - mean) / (var + self.eps).sqrt() * self.g + self.b


class PreNorm(nn.Module):
    def __init__(self, dim, fn):
        super().__init__()
        self.fn = fn
        self.norm = LayerNorm(dim)

    def forward(self, x):
        x = self.norm(x)
        return self.fn(x)


class Block(nn.Module):
    def __init__(self, dim, dim_out, large=False):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim_out, 7 if large else 3, padding=3 if large else 1), LayerNorm(dim_out), nn.ReLU()
        )

    def forward(self, x):
        return self.block(x)


class ResnetBlock(nn.Module):
    def __init__(self, dim, dim_out, time_emb_dim=None, large=False):
        super().__init__()
        self.mlp = (
            nn.Sequential(nn.LeakyReLU(0.2), nn.Linear(time_emb_dim, dim_out))
            if exists(time_emb_dim)
            else None
        )

        self.block1 = Block(dim, dim_out, large)
        self.block2 = Block(dim_out, dim_out)
        self.res_conv = nn.Conv2d(dim, dim_out, 1) if dim != dim_out else nn.Identity()

    def forward(self, x, time_emb=None):
        h = self.block1(x)

        if exists(time_emb):
            h = h + self.mlp(time_emb)[:, :, None, None]

        h = self.block2(h)
        return h + self.res_conv(x)


class LinearAttention(nn.Module):
    def __init__(self, dim, heads=1, dim_head=None):
        super().__init__()
        if dim_head is None:
            dim_head = dim
        self.scale = dim_head ** -0.5
        self.heads = heads
        hidden_dim = dim_head * heads
        self.to_qkv = nn.Conv2d(dim, hidden_dim * 3, 1, bias=False)
        self.to_out = nn.Conv2d(hidden_dim, dim, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        qkv = self.to_qkv(x).chunk(3, dim=1)
        q, k, v = map(lambda t: t.reshape(b, self.heads, -1, h * w), qkv)
        q = q * self.scale

        k = k.softmax(dim=-1)
        context = torch.einsum("b h d n, b h e n -> b h d e", k, v)

        out = torch.einsum("b h d e, b h d n -> b h e n", context, q)
        out = out.reshape(b, -1, h, w)
        return self.to_out(out)


# modules/unet.py

class Unet(nn.Module):
    def __init__(self, dim, out_dim=None, dim_mults=(1, 2), context_dim_mults=(1, 2), channels=3,
                 context_channels=3, with_time_emb=True):
        super().__init__()
        self.channels = channels

        dims = [channels, *map(lambda m: dim * m, dim_mults)]
        context_dims = [context_channels, *map(lambda m: dim * m, context_dim_mults)]
        in_out = list(zip(dims[:-1], dims[1:]))

        if with_time_emb:
            time_dim = dim
            self.time_mlp = nn.Sequential(nn.Linear(1, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))
        else:
            time_dim = None
            self.time_mlp = None

        self.downs = nn.ModuleList([])
        self.ups = nn.ModuleList([])
        num_resolutions = len(in_out)

        for ind, (dim_in, dim_out) in enumerate(in_out):
            is_last = ind >= (num_resolutions - 1)

            self.downs.append(
                nn.ModuleList(
                    [
                        ResnetBlock(
                                dim_in + context_dims[ind]
                                if (not is_last) and (ind < (len(context_dims) - 1))
                                else dim_in,
                                dim_out,
                                time_dim,
                                True if ind == 0 else False
                            ),
                        ResnetBlock(dim_out, dim_out, time_dim),
                        Residual(PreNorm(dim_out, LinearAttention(dim_out))),
                        Downsample(dim_out) if not is_last else nn.Identity(),
                    ]
                )
            )

        mid_dim = dims[-1]
        self.mid_block1 = ResnetBlock(mid_dim, mid_dim, time_dim)
        self.mid_attn = Residual(PreNorm(mid_dim, LinearAttention(mid_dim)))
        self.mid_block2 = ResnetBlock(mid_dim, mid_dim, time_dim)

        for ind, (dim_in, dim_out) in enumerate(reversed(in_out[1:])):
            is_last = ind >= (num_resolutions - 1)

            self.ups.append(
                nn.ModuleList(
                    [
                        ResnetBlock(dim_out * 2, dim_in, time_dim),
                        ResnetBlock(dim_in, dim_in, time_dim),
                        Residual(PreNorm(dim_in, LinearAttention(dim_in))),
                        Upsample(dim_in) if not is_last else nn.Identity(),
                    ]
                )
            )

        out_dim = default(out_dim, channels)
        self.final_conv = nn.Sequential(LayerNorm(dim), nn.Conv2d(dim, out_dim, 7, padding=3))

    def encode(self, x, t, context):
        h = []
        for idx, (backbone, backbone2, attn, downsample) in enumerate(self.downs):
            x = torch.cat([x, context[idx]], dim=1) if idx < len(context) else x
            x = backbone(x, t)
            x = backbone2(x, t)
            x = attn(x)
            h.append(x)
            x = downsample(x)

        x = self.mid_block1(x, t)
        return x, h

    def decode(self, x, h, t):
        x = self.mid_attn(x)
        x = self.mid_block2(x, t)

        for backbone, backbone2, attn, upsample in self.ups:
            x = torch.cat((x, h.pop()), dim=1)
            x = backbone(x, t)
            x = backbone2(x, t)
            x = attn(x)
            x = upsample(x)
        return self.final_conv(x)

    def forward(self, x, time=None, context=None):
        t = self.time_mlp(time) if exists(self.time_mlp) else None

        x, h = self.encode(x, t, context)
        return self.decode(x, h, t)


class ContextStandIn(nn.Module):  # stand-in for the compression context model (not the repository's)
    def __init__(self, channels=3):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)

    def forward(self, images):
        return {"output": [self.conv(images)], "bpp": torch.zeros(images.shape[0])}


# modules/denoising_diffusion.py

class GaussianDiffusion(nn.Module):
    def __init__(self, denoise_fn, context_fn, num_timesteps=1000, loss_type="l1"):
        super().__init__()
        self.denoise_fn = denoise_fn
        self.context_fn = context_fn
        self.loss_type = loss_type
        to_torch = partial(torch.tensor, dtype=torch.float32)
        train_betas = linear_beta_schedule(num_timesteps)
        train_alphas = 1.0 - train_betas
        train_alphas_cumprod = np.cumprod(train_alphas, axis=0)
        self.num_timesteps = int(num_timesteps)
        self.register_buffer("train_sqrt_alphas_cumprod", to_torch(np.sqrt(train_alphas_cumprod)))
        self.register_buffer(
            "train_sqrt_one_minus_alphas_cumprod", to_torch(np.sqrt(1.0 - train_alphas_cumprod))
        )

    def q_sample(self, x_start, t, noise):
        return (
            extract(self.train_sqrt_alphas_cumprod, t, x_start.shape) * x_start
            + extract(self.train_sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise
        )

    def p_losses(self, x_start, context_dict, t):
        noise = torch.randn_like(x_start)

        x_noisy = self.q_sample(x_start=x_start, t=t, noise=noise)
        fx = self.denoise_fn(
            x_noisy, t.float().unsqueeze(-1) / self.num_timesteps, context=context_dict["output"]
        )
        if self.loss_type == "l1":
            err = (noise - fx).abs().mean()
        else:
            err = F.mse_loss(noise, fx)
        return err

    def forward(self, images):
        device = images.device
        B, C, H, W = images.shape
        t = torch.randint(0, self.num_timesteps, (B,), device=device).long()
        output_dict = self.context_fn(images)
        loss = self.p_losses(images * 2.0 - 1.0, output_dict, t)
        return loss


denoise_model = Unet(dim=8, channels=3, context_channels=3, dim_mults=(1, 2), context_dim_mults=(1, 2))
context_model = ContextStandIn(channels=3)
diffusion = GaussianDiffusion(denoise_fn=denoise_model, context_fn=context_model, num_timesteps=100)
opt = torch.optim.Adam(diffusion.parameters(), lr=1e-4)

for step in range(2):
    data = torch.rand(2, 3, 16, 16)
    opt.zero_grad()
    loss = diffusion(data)
    loss.backward()
    opt.step()
    print(step, loss.item())
