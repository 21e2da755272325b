# Reproduction of https://github.com/hui-po-wang/Pytorch-VAE-GAN/issues/5 (the repository's VAE-GAN notebook fails in
# err_enc.backward() with "one of the variables needed for gradient computation has been modified by an inplace
# operation: [torch.cuda.FloatTensor [32, 3, 5, 5]] is at version 2; expected version 1": the training loop steps the
# decoder's optimizer (opt_dec.step()) between err_dec.backward(retain_graph=True) and err_enc.backward(), and the
# encoder loss backpropagates through the decoder (rec_loss depends on rec_enc), whose weights, e.g. deconv4's
# [32, 3, 5, 5], were saved by the forward pass. The notebook's Encoder / Decoder / VAE_GAN_Generator / Discriminator
# and training loop, shrunk (channel widths / 8, hidden 2048 -> 64, code size 16, batch 8 of random 64x64 images
# instead of CelebA, 2 iterations); .cuda() dropped, image saving and logging left out).
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.autograd import Variable

torch.manual_seed(0)


class Encoder(nn.Module):
    def __init__(self, input_channels, output_channels, representation_size = 8):
        super(Encoder, self).__init__()
        # input parameters
        self.input_channels = input_channels
        self.output_channels = output_channels

        self.features = nn.Sequential(
            # nc x 64 x 64
            nn.Conv2d(self.input_channels, representation_size, 5, stride=2, padding=2),
            nn.BatchNorm2d(representation_size),
            nn.ReLU(),
            # hidden_size x 32 x 32
            nn.Conv2d(representation_size, representation_size*2, 5, stride=2, padding=2),
            nn.BatchNorm2d(representation_size * 2),
            nn.ReLU(),
            # hidden_size*2 x 16 x 16
            nn.Conv2d(representation_size*2, representation_size*4, 5, stride=2, padding=2),
            nn.BatchNorm2d(representation_size * 4),
            nn.ReLU())
            # hidden_size*4 x 8 x 8

        self.mean = nn.Sequential(
            nn.Linear(representation_size*4*8*8, 64),
            nn.BatchNorm1d(64),
            nn.ReLU(),
            nn.Linear(64, output_channels))

        self.logvar = nn.Sequential(
            nn.Linear(representation_size*4*8*8, 64),
            nn.BatchNorm1d(64),
            nn.ReLU(),
            nn.Linear(64, output_channels))

    def forward(self, x):
        batch_size = x.size()[0]

        hidden_representation = self.features(x)

        mean = self.mean(hidden_representation.view(batch_size, -1))
        logvar = self.logvar(hidden_representation.view(batch_size, -1))

        return mean, logvar


class Decoder(nn.Module):
    def __init__(self, input_size, representation_size):
        super(Decoder, self).__init__()
        self.input_size = input_size
        self.representation_size = representation_size
        dim = representation_size[0] * representation_size[1] * representation_size[2]

        self.preprocess = nn.Sequential(
            nn.Linear(input_size, dim),
            nn.BatchNorm1d(dim),
            nn.ReLU())

            # 32 x 8 x 8
        self.deconv1 = nn.ConvTranspose2d(representation_size[0], 32, 5, stride=2, padding=2)
        self.act1 = nn.Sequential(nn.BatchNorm2d(32),
                                  nn.ReLU())
            # 32 x 16 x 16
        self.deconv2 = nn.ConvTranspose2d(32, 16, 5, stride=2, padding=2)
        self.act2 = nn.Sequential(nn.BatchNorm2d(16),
                                  nn.ReLU())
            # 16 x 32 x 32
        self.deconv3 = nn.ConvTranspose2d(16, 32, 5, stride=2, padding=2)
        self.act3 = nn.Sequential(nn.BatchNorm2d(32),
                                  nn.ReLU())
            # 32 x 64 x 64
        self.deconv4 = nn.ConvTranspose2d(32, 3, 5, stride=1, padding=2)
            # 3 x 64 x 64
        self.activation = nn.Tanh()

    def forward(self, code):
        bs = code.size()[0]
        preprocessed_codes = self.preprocess(code)
        preprocessed_codes = preprocessed_codes.view(-1,
                                                     self.representation_size[0],
                                                     self.representation_size[1],
                                                     self.representation_size[2])
        output = self.deconv1(preprocessed_codes, output_size=(bs, 32, 16, 16))
        output = self.act1(output)
        output = self.deconv2(output, output_size=(bs, 16, 32, 32))
        output = self.act2(output)
        output = self.deconv3(output, output_size=(bs, 32, 64, 64))
        output = self.act3(output)
        output = self.deconv4(output, output_size=(bs, 3, 64, 64))
        output = self.activation(output)
        return output


class VAE_GAN_Generator(nn.Module):
    def __init__(self, input_channels, hidden_size, representation_size=(32, 8, 8)):
        super(VAE_GAN_Generator, self).__init__()
        self.input_channels = input_channels
        self.hidden_size = hidden_size
        self.representation_size = representation_size

        self.encoder = Encoder(input_channels, hidden_size)
        self.decoder = Decoder(hidden_size, representation_size)

    def forward(self, x):
        batch_size = x.size()[0]
        mean, logvar = self.encoder(x)
        std = logvar.mul(0.5).exp_()

        reparametrized_noise = Variable(torch.randn((batch_size, self.hidden_size)))

        reparametrized_noise = mean + std * reparametrized_noise

        rec_images = self.decoder(reparametrized_noise)

        return mean, logvar, rec_images


class Discriminator(nn.Module):
    def __init__(self, input_channels, representation_size=(32, 8, 8)):
        super(Discriminator, self).__init__()
        self.representation_size = representation_size
        dim = representation_size[0] * representation_size[1] * representation_size[2]

        self.main = nn.Sequential(
            nn.Conv2d(input_channels, 4, 5, stride=1, padding=2),
            nn.BatchNorm2d(4),
            nn.LeakyReLU(0.2),
            nn.Conv2d(4, 16, 5, stride=2, padding=2),
            nn.BatchNorm2d(16),
            nn.LeakyReLU(0.2),
            nn.Conv2d(16, 32, 5, stride=2, padding=2),
            nn.BatchNorm2d(32),
            nn.LeakyReLU(0.2),
            nn.Conv2d(32, 32, 5, stride=2, padding=2),
            nn.BatchNorm2d(32),
            nn.LeakyReLU(0.2))

        self.lth_features = nn.Sequential(
            nn.Linear(dim, 64),
            nn.LeakyReLU(0.2))

        self.sigmoid_output = nn.Sequential(
            nn.Linear(64, 1),
            nn.Sigmoid())

    def forward(self, x):
        batch_size = x.size()[0]
        features = self.main(x)
        lth_rep = self.lth_features(features.view(batch_size, -1))
        output = self.sigmoid_output(lth_rep)
        return output

    def similarity(self, x):
        batch_size = x.size()[0]
        features = self.main(x)
        lth_rep = self.lth_features(features.view(batch_size, -1))
        return lth_rep


# define constant
input_channels = 3
hidden_size = 16
max_epochs = 1
lr = 3e-4

beta = 5
alpha = 0.1
gamma = 15

batch_size = 8
train_loader = [(torch.rand(batch_size, 3, 64, 64) * 2 - 1, 0) for _ in range(2)]

G = VAE_GAN_Generator(input_channels, hidden_size)
D = Discriminator(input_channels)

criterion = nn.BCELoss()

opt_enc = optim.RMSprop(G.encoder.parameters(), lr=lr)
opt_dec = optim.RMSprop(G.decoder.parameters(), lr=lr)
opt_dis = optim.RMSprop(D.parameters(), lr=lr * alpha)

for epoch in range(max_epochs):
    D_real_list, D_rec_enc_list, D_rec_noise_list, D_list = [], [], [], []
    g_loss_list, rec_loss_list, prior_loss_list = [], [], []
    for data, _ in train_loader:
        batch_size = data.size()[0]
        ones_label = Variable(torch.ones(batch_size, 1))
        zeros_label = Variable(torch.zeros(batch_size, 1))

        datav = Variable(data)
        mean, logvar, rec_enc = G(datav)

        noisev = Variable(torch.randn(batch_size, hidden_size))
        rec_noise = G.decoder(noisev)

        # train discriminator
        output = D(datav)
        errD_real = criterion(output, ones_label)
        D_real_list.append(output.data.mean())
        output = D(rec_enc)
        errD_rec_enc = criterion(output, zeros_label)
        D_rec_enc_list.append(output.data.mean())
        output = D(rec_noise)
        errD_rec_noise = criterion(output, zeros_label)
        D_rec_noise_list.append(output.data.mean())

        dis_img_loss = errD_real + errD_rec_enc + errD_rec_noise
        D_list.append(dis_img_loss.data.mean())
        opt_dis.zero_grad()
        dis_img_loss.backward(retain_graph=True)
        opt_dis.step()

        # train decoder
        output = D(datav)
        errD_real = criterion(output, ones_label)
        output = D(rec_enc)
        errD_rec_enc = criterion(output, zeros_label)
        output = D(rec_noise)
        errD_rec_noise = criterion(output, zeros_label)

        similarity_rec_enc = D.similarity(rec_enc)
        similarity_data = D.similarity(datav)

        dis_img_loss = errD_real + errD_rec_enc + errD_rec_noise
        gen_img_loss = - dis_img_loss

        g_loss_list.append(gen_img_loss.data.mean())
        rec_loss = ((similarity_rec_enc - similarity_data) ** 2).mean()
        rec_loss_list.append(rec_loss.data.mean())
        err_dec = gamma * rec_loss + gen_img_loss

        opt_dec.zero_grad()
        err_dec.backward(retain_graph=True)
        opt_dec.step()

        # train encoder
        prior_loss = 1 + logvar - mean.pow(2) - logvar.exp()
        prior_loss = (-0.5 * torch.sum(prior_loss))/torch.numel(mean.data)
        prior_loss_list.append(prior_loss.data.mean())
        err_enc = prior_loss + beta * rec_loss

        opt_enc.zero_grad()
        err_enc.backward()
        opt_enc.step()

    print('[%d/%d]: Loss_D:%.4f, Loss_G:%.4f, rec_loss:%.4f, prior_loss:%.4f'
          % (epoch, max_epochs, np.mean(D_list), np.mean(g_loss_list), np.mean(rec_loss_list),
             np.mean(prior_loss_list)))
