# Reproduction of https://github.com/VinAIResearch/PSENet-Image-Enhancement/issues/1 (source/framework.py at cbc5fa1:
# the reporter added loss.backward() to PSENet.training_step, while PyTorch Lightning's automatic optimization
# already calls backward on the loss training_step returns; UnetTMO and the IQA scorer shrunk to a few layers, the
# Lightning fit loop written out as the steps Lightning runs; logging dropped).
import torch
import torch.nn as nn

torch.manual_seed(0)


class UnetTMO(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1))

    def forward(self, x):
        gamma = torch.sigmoid(self.enc(x)) * 2 + 0.1
        return x.clamp(1e-4, 1) ** gamma, gamma


class IQA(nn.Module):
    def forward(self, x):  # a fixed exposure/contrast score per pixel, as the pretrained scorer gives
        return -(x.mean(dim=1, keepdim=True) - 0.5).abs() + x.std(dim=1, keepdim=True)


class TVLoss(nn.Module):
    def forward(self, x):
        return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


class PSENet(nn.Module):
    def __init__(self, tv_w, gamma_lower, gamma_upper, number_refs, lr):
        super().__init__()
        self.tv_w = tv_w
        self.gamma_lower = gamma_lower
        self.gamma_upper = gamma_upper
        self.number_refs = number_refs
        self.lr = lr
        self.model = UnetTMO()
        self.mse = torch.nn.MSELoss()
        self.tv = TVLoss()
        self.iqa = IQA()
        self.saved_input = None
        self.saved_pseudo_gt = None

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=self.lr, betas=[0.9, 0.99])

    def generate_pseudo_gt(self, im):
        bs, ch, h, w = im.shape
        underexposed_ranges = torch.linspace(0, self.gamma_upper, steps=self.number_refs + 1).to(im.device)[:-1]
        step_size = self.gamma_upper / self.number_refs
        underexposed_gamma = torch.exp(
            torch.rand([bs, self.number_refs], device=im.device) * step_size + underexposed_ranges[None, :]
        )
        overrexposed_ranges = torch.linspace(self.gamma_lower, 0, steps=self.number_refs + 1).to(im.device)[:-1]
        step_size = - self.gamma_lower / self.number_refs
        overrexposed_gamma = torch.exp(
            torch.rand([bs, self.number_refs], device=im.device) * overrexposed_ranges[None, :]
        )
        gammas = torch.cat([underexposed_gamma, overrexposed_gamma], dim=1)
        synthetic_references = 1 - (1 - im[:, None]) ** gammas[:, :, None, None, None]
        previous_iter_output = self.model(im)[0].clone().detach()
        references = torch.cat([im[:, None], previous_iter_output[:, None], synthetic_references], dim=1)
        nref = references.shape[1]
        scores = self.iqa(references.view(bs * nref, ch, h, w))
        scores = scores.view(bs, nref, 1, h, w)
        max_idx = torch.argmax(scores, dim=1)
        max_idx = max_idx.repeat(1, ch, 1, 1)[:, None]
        pseudo_gt = torch.gather(references, 1, max_idx)
        return pseudo_gt.squeeze(1)

    def training_step(self, batch, batch_idx):
        nth_input = batch
        nth_pseudo_gt = self.generate_pseudo_gt(batch)
        if self.saved_input is not None:
            im = self.saved_input
            pred_im, pred_gamma = self.model(im)
            pseudo_gt = self.saved_pseudo_gt
            reconstruction_loss = self.mse(pred_im, pseudo_gt)
            tv_loss = self.tv(pred_gamma)
            loss = reconstruction_loss + tv_loss * self.tv_w
        else:
            # skip updating model's weight at the first batch
            loss = None
        # saving n-th input and n-th pseudo gt
        self.saved_input = nth_input
        self.saved_pseudo_gt = nth_pseudo_gt
        return loss


# Trainer.fit with automatic optimization: zero_grad, training_step, backward on the returned loss, step.
model = PSENet(tv_w=5, gamma_lower=-2, gamma_upper=3, number_refs=1, lr=5e-4)
optimizer = model.configure_optimizers()
train_loader = [torch.rand(2, 3, 8, 8) for _ in range(3)]
for batch_idx, batch in enumerate(train_loader):
    optimizer.zero_grad()
    loss = model.training_step(batch, batch_idx)
    if loss is None:
        continue
    loss.backward()
    optimizer.step()
print(loss.item())
