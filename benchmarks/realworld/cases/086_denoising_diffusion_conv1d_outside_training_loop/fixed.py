# Reproduction of https://github.com/lucidrains/denoising-diffusion-pytorch/issues/109 (the reporter's own Conv1d
# converts the data to the network's input shape outside the training loop; GaussianDiffusion.p_losses and a
# Trainer loop reduced to their core).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class GaussianDiffusion(nn.Module):
    def __init__(self, model, timesteps=10):
        super().__init__()
        self.model = model
        betas = torch.linspace(1e-4, 0.02, timesteps)
        alphas_cumprod = torch.cumprod(1. - betas, dim=0)
        self.num_timesteps = timesteps
        self.register_buffer('sqrt_alphas_cumprod', alphas_cumprod.sqrt())
        self.register_buffer('sqrt_one_minus_alphas_cumprod', (1. - alphas_cumprod).sqrt())

    def p_losses(self, x_start, t):
        noise = torch.randn_like(x_start)
        x = self.sqrt_alphas_cumprod[t][:, None, None] * x_start + self.sqrt_one_minus_alphas_cumprod[t][:, None, None] * noise
        model_out = self.model(x)
        return F.mse_loss(model_out, noise)

    def forward(self, img):
        t = torch.randint(0, self.num_timesteps, (img.shape[0],)).long()
        return self.p_losses(img, t)


class Trainer:
    def __init__(self, diffusion, dataset, train_num_steps=3, lr=1e-4):
        self.model = diffusion
        self.ds = dataset
        self.train_num_steps = train_num_steps
        self.opt = torch.optim.Adam(diffusion.parameters(), lr=lr)

    def train(self):
        for step in range(self.train_num_steps):
            data = self.ds[torch.randperm(len(self.ds))[:4]]
            loss = self.model(data)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
        return loss.item()


unet = nn.Sequential(nn.Conv1d(4, 16, 3, padding=1), nn.SiLU(), nn.Conv1d(16, 4, 3, padding=1))
diffusion = GaussianDiffusion(unet)
conv = nn.Conv1d(1, 4, 1)
training_seq = torch.rand(8, 1, 32)
with torch.no_grad():
    data = conv(training_seq)
trainer = Trainer(diffusion, data)
print(trainer.train())
