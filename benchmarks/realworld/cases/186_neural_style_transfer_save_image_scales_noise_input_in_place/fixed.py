# Reproduction of https://github.com/halahup/NeuralStyleTransfer/issues/1 (a neural style transfer script that
# optimises a noise image with Adam fails on CPU in total_loss.backward() with "one of the variables needed for
# gradient computation has been modified by an inplace operation: [torch.FloatTensor [1, 3, 512, 512]] is at version 3;
# expected version 0": before backward it saves the image with save_image(noise.cpu().detach(), ...); on CPU .cpu() is
# noise itself, and torchvision's save_image of that time (make_grid returns a squeeze view for a single image, then
# grid.mul_(255).add_(0.5).clamp_(0, 255); torchvision issue #1206, fixed in #1244) scales noise in place three times,
# while the first VGG conv had saved noise. nst.py, vgg.py and losses.py shrunk: VGG19 features built locally with
# channel widths / 8 and random weights (no download), 32x32 random content and style images, 2 iterations, images
# written to a temporary folder; save_image/make_grid inlined as in torchvision 0.4).
import os
import tempfile
import numpy as np
import torch
import torch.nn as nn
from PIL import Image
from torch import optim

torch.manual_seed(0)


# torchvision 0.4 utils.make_grid / save_image (single-image path)
def make_grid(tensor, nrow=8, padding=2, normalize=False, range=None, scale_each=False, pad_value=0):
    if tensor.dim() == 2:  # single image H x W
        tensor = tensor.unsqueeze(0)
    if tensor.dim() == 3:  # single image
        if tensor.size(0) == 1:  # if single-channel, convert to 3-channel
            tensor = torch.cat((tensor, tensor, tensor), 0)
        tensor = tensor.unsqueeze(0)

    if tensor.dim() == 4 and tensor.size(1) == 1:  # single-channel images
        tensor = torch.cat((tensor, tensor, tensor), 1)

    if tensor.size(0) == 1:
        return tensor.squeeze(0)
    raise NotImplementedError("grids of several images are not needed here")


def save_image(tensor, filename, nrow=8, padding=2, normalize=False, range=None, scale_each=False, pad_value=0):
    grid = make_grid(tensor, nrow=nrow, padding=padding, pad_value=pad_value,
                     normalize=normalize, range=range, scale_each=scale_each)
    # Add 0.5 after unnormalizing to [0, 255] to round to nearest integer
    ndarr = grid.mul_(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to('cpu', torch.uint8).numpy()
    im = Image.fromarray(ndarr)
    im.save(filename)


# losses.py
def gram(tensor):
    return torch.mm(tensor, tensor.t())


def gram_loss(noise_img_gram, style_img_gram, N, M):
    return torch.sum(torch.pow(noise_img_gram - style_img_gram, 2)).div((np.power(N*M*2, 2, dtype=np.float64)))


def total_variation_loss(image):
    loss = torch.mean(torch.abs(image[:, :, :, :-1] - image[:, :, :, 1:])) + \
        torch.mean(torch.abs(image[:, :, :-1, :] - image[:, :, 1:, :]))
    return loss


def content_loss(noise: torch.Tensor, image: torch.Tensor):
    return 1/2. * torch.sum(torch.pow(noise - image, 2))


# vgg.py (torchvision vgg19 features, cfg 'E', widths / 8)
def vgg19_features():
    layers, in_channels = [], 3
    for v in [8, 8, 'M', 16, 16, 'M', 32, 32, 32, 32, 'M', 64, 64, 64, 64, 'M', 64, 64, 64, 64, 'M']:
        if v == 'M':
            layers += [nn.MaxPool2d(kernel_size=2, stride=2)]
        else:
            layers += [nn.Conv2d(in_channels, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            in_channels = v
    return nn.Sequential(*layers)


class VGG(nn.Module):
    def __init__(self):
        super(VGG, self).__init__()
        self.vgg = vgg19_features()

    def get_content_activations(self, x: torch.Tensor) -> torch.Tensor:
        features = self.vgg[:23](x)
        return features

    def get_style_activations(self, x):
        features = [self.vgg[:4](x)] + [self.vgg[:7](x)] + [self.vgg[:12](x)] + [self.vgg[:21](x)] + [self.vgg[:30](x)]
        return features

    def forward(self, x):
        return self.vgg(x)


def main(img_dim, num_iter, style_weight, content_weight, variation_weight, print_every, save_every, out_dir):
    device = torch.device('cpu')

    content_image = torch.randn(1, 3, img_dim, img_dim, device=device)
    style_image = torch.randn(1, 3, img_dim, img_dim, device=device)

    vgg = VGG().to(device).eval()

    for name, child in vgg.vgg.named_children():
        if isinstance(child, nn.MaxPool2d):
            vgg.vgg[int(name)] = nn.AvgPool2d(kernel_size=2, stride=2)

    for param in vgg.parameters():
        param.requires_grad = False

    content_activations = vgg.get_content_activations(content_image).detach()
    content_activations = content_activations.view(64, -1)

    style_activations = vgg.get_style_activations(style_image)
    for i in range(len(style_activations)):
        style_activations[i] = style_activations[i].squeeze().view(style_activations[i].shape[1], -1).detach()

    style_grams = [gram(style_activations[i]) for i in range(len(style_activations))]

    noise = torch.randn(1, 3, img_dim, img_dim, device=device, requires_grad=True)

    adam = optim.Adam(params=[noise], lr=0.01, betas=(0.9, 0.999))

    for iteration in range(num_iter):

        adam.zero_grad()

        noise_content_activations = vgg.get_content_activations(noise)
        noise_content_activations = noise_content_activations.view(64, -1)
        content_loss_ = content_loss(noise_content_activations, content_activations)

        noise_style_activations = vgg.get_style_activations(noise)
        for i in range(len(noise_style_activations)):
            noise_style_activations[i] = noise_style_activations[i].squeeze().view(noise_style_activations[i].shape[1], -1)

        noise_grams = [gram(noise_style_activations[i]) for i in range(len(noise_style_activations))]

        style_loss = 0
        for i in range(len(style_activations)):
            N, M = noise_style_activations[i].shape[0], noise_style_activations[i].shape[1]
            style_loss += (gram_loss(noise_grams[i], style_grams[i], N, M) / 5.)

        style_loss = style_loss.to(device)

        variation_loss = total_variation_loss(noise).to(device)

        total_loss = content_weight * content_loss_ + style_weight * style_loss + variation_weight * variation_loss

        if iteration % print_every == 0:
            print("Iteration: {}, Content Loss: {:.3f}, Style Loss: {:.3f}, Var Loss: {:.3f}".format(
                iteration, content_weight * content_loss_.item(), style_weight * style_loss.item(),
                variation_weight * variation_loss.item()))

        if iteration % save_every == 0:
            save_image(noise.cpu().detach().clone(), os.path.join(out_dir, 'iter_{}.png'.format(iteration)))

        total_loss.backward()

        adam.step()


if __name__ == "__main__":
    main(img_dim=32, num_iter=2, style_weight=10e6, content_weight=10e-4, variation_weight=10e3,
         print_every=1, save_every=1, out_dir=tempfile.mkdtemp())
