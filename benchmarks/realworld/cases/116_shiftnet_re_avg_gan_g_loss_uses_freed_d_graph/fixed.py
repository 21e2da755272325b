# Reproduction of https://github.com/Zhaoyi-Yan/Shift-Net_pytorch/issues/34 (models/shift_net/shiftnet_model.py before
# the fix: with --gan_type re_avg_gan, backward_G builds the relativistic generator loss from self.pred_fake, the
# discriminator output that backward_D already backpropagated, so loss_G.backward() runs through D's freed graph.
# The shift-net U-Net and the PatchGAN discriminator shrunk to two convs each; mask handling reduced to the center crop,
# the discounted L1 and the scheduler dropped).
from argparse import Namespace

import torch
import torch.nn as nn

torch.manual_seed(0)


class GANLoss(nn.Module):
    def __init__(self, gan_type='vanilla', target_real_label=1.0, target_fake_label=0.0):
        super(GANLoss, self).__init__()
        self.register_buffer('real_label', torch.tensor(target_real_label))
        self.register_buffer('fake_label', torch.tensor(target_fake_label))
        self.loss = nn.BCEWithLogitsLoss()

    def __call__(self, input, target_is_real):
        target_tensor = (self.real_label if target_is_real else self.fake_label).expand_as(input)
        return self.loss(input, target_tensor)


class ShiftNetModel:
    def __init__(self, opt):
        self.opt = opt
        self.wgan_gp = False
        self.netG = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(True), nn.Conv2d(8, 3, 3, padding=1), nn.Tanh())
        self.netD = nn.Sequential(nn.Conv2d(3, 8, 4, 2, 1), nn.LeakyReLU(0.2, True), nn.Conv2d(8, 1, 3, 1, 1))
        self.criterionGAN = GANLoss(gan_type=opt.gan_type)
        self.criterionL1 = torch.nn.L1Loss()
        self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
        self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
        self.rand_t, self.rand_l = int(self.opt.fineSize/4) + self.opt.overlap, int(self.opt.fineSize/4) + self.opt.overlap

    def set_input(self, input):
        self.real_A = input['A']
        self.real_B = input['B']

    def set_requires_grad(self, net, requires_grad=False):
        for param in net.parameters():
            param.requires_grad = requires_grad

    def forward(self):
        self.fake_B = self.netG(self.real_A)

    def backward_D(self):
        fake_B = self.fake_B
        # Real
        real_B = self.real_B # GroundTruth

        # Has been verfied, for square mask, let D discrinate masked patch, improves the results.
        if self.opt.mask_type == 'center' or self.opt.mask_sub_type == 'rect':
            # Using the cropped fake_B as the input of D.
            fake_B = self.fake_B[:, :, self.rand_t:self.rand_t+self.opt.fineSize//2-2*self.opt.overlap, \
                                            self.rand_l:self.rand_l+self.opt.fineSize//2-2*self.opt.overlap]

            real_B = self.real_B[:, :, self.rand_t:self.rand_t+self.opt.fineSize//2-2*self.opt.overlap, \
                                            self.rand_l:self.rand_l+self.opt.fineSize//2-2*self.opt.overlap]

        self.pred_fake = self.netD(fake_B.detach())
        self.pred_real = self.netD(real_B)

        if self.opt.gan_type in ['vanilla', 'lsgan']:
            self.loss_D_fake = self.criterionGAN(self.pred_fake, False)
            self.loss_D_real = self.criterionGAN (self.pred_real, True)

            self.loss_D = (self.loss_D_fake + self.loss_D_real) * 0.5

        elif self.opt.gan_type == 're_s_gan':
            self.loss_D = self.criterionGAN(self.pred_real - self.pred_fake, True)

        elif self.opt.gan_type == 're_avg_gan':
            self.loss_D =  (self.criterionGAN (self.pred_real - torch.mean(self.pred_fake), True) \
                           + self.criterionGAN (self.pred_fake - torch.mean(self.pred_real), False)) / 2.

        self.loss_D.backward()

    def backward_G(self):
        # First, G(A) should fake the discriminator
        fake_B = self.fake_B
        # Has been verfied, for square mask, let D discrinate masked patch, improves the results.
        if self.opt.mask_type == 'center' or self.opt.mask_sub_type == 'rect':
        # Using the cropped fake_B as the input of D.
            fake_B = self.fake_B[:, :, self.rand_t:self.rand_t+self.opt.fineSize//2-2*self.opt.overlap, \
                                            self.rand_l:self.rand_l+self.opt.fineSize//2-2*self.opt.overlap]
            real_B = self.real_B[:, :, self.rand_t:self.rand_t+self.opt.fineSize//2-2*self.opt.overlap, \
                                            self.rand_l:self.rand_l+self.opt.fineSize//2-2*self.opt.overlap]
        pred_fake = self.netD(fake_B)

        if self.opt.gan_type in ['vanilla', 'lsgan']:
            self.loss_G_GAN = self.criterionGAN(pred_fake, True) * self.opt.gan_weight

        elif self.opt.gan_type == 're_s_gan':
            pred_real = self.netD (real_B)
            self.loss_G_GAN = self.criterionGAN (pred_fake - pred_real, True) * self.opt.gan_weight

        elif self.opt.gan_type == 're_avg_gan':
            self.pred_real = self.netD(real_B)
            self.loss_G_GAN =  (self.criterionGAN (self.pred_real - torch.mean(pred_fake), False) \
                           + self.criterionGAN (pred_fake - torch.mean(self.pred_real), True)) / 2.
            self.loss_G_GAN *=  self.opt.gan_weight

        self.loss_G_L1 = self.criterionL1(self.fake_B, self.real_B) * self.opt.lambda_A
        self.loss_G = self.loss_G_L1 + self.loss_G_GAN

        self.loss_G.backward()

    def optimize_parameters(self):
        self.forward()
        # update D
        self.set_requires_grad(self.netD, True)
        self.optimizer_D.zero_grad()
        self.backward_D()
        self.optimizer_D.step()

        # update G
        self.set_requires_grad(self.netD, False)
        self.optimizer_G.zero_grad()
        self.backward_G()
        self.optimizer_G.step()


opt = Namespace(gan_type='re_avg_gan', mask_type='center', mask_sub_type='rect', fineSize=16, overlap=0, lr=2e-4,
                beta1=0.5, gan_weight=0.2, lambda_A=100)
model = ShiftNetModel(opt)
for i in range(2):
    real = torch.rand(2, 3, 16, 16) * 2 - 1
    masked = real.clone()
    masked[:, :, 4:12, 4:12] = 0
    model.set_input({'A': masked, 'B': real})
    model.optimize_parameters()
print(model.loss_G.item())
