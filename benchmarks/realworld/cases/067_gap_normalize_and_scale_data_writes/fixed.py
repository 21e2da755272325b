# Reproduction of https://github.com/OmidPoursaeed/Generative_Adversarial_Perturbations/issues/4 (GAP_clf.py train() and
# normalize_and_scale() as the issue links them, before the repository switched to out-of-place ops with .clone()).
from types import SimpleNamespace
import numpy as np
import torch
import torch.nn as nn
from torch.autograd import Variable

torch.manual_seed(0)
opt = SimpleNamespace(foolmodel='vgg16', batchSize=2, testBatchSize=2, target=-1, perturbation_type='imdep')
mag_in = 10.0
mean_arr = [0.485, 0.456, 0.406]
stddev_arr = [0.229, 0.224, 0.225]
netG = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(True), nn.Conv2d(8, 3, 3, padding=1), nn.Tanh())
pretrained_clf = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))
for p in pretrained_clf.parameters():
    p.requires_grad = False
criterion_pre = nn.CrossEntropyLoss()
optimizerG = torch.optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))


def normalize_and_scale(delta_im, mode='train'):
    if opt.foolmodel == 'incv3':
        delta_im = nn.ConstantPad2d((0,-1,-1,0),0)(delta_im) # crop slightly to match inception

    delta_im = delta_im + 1 # now 0..2
    delta_im = delta_im * 0.5 # now 0..1

    # normalize image color channels
    for c in range(3):
        delta_im[:,c,:,:] = (delta_im[:,c,:,:].clone() - mean_arr[c]) / stddev_arr[c]

    # threshold each channel of each image in deltaIm according to inf norm
    # do on a per image basis as the inf norm of each image could be different
    bs = opt.batchSize if (mode == 'train') else opt.testBatchSize
    for i in range(bs):
        # do per channel l_inf normalization
        for ci in range(3):
            l_inf_channel = delta_im[i,ci,:,:].detach().abs().max()
            mag_in_scaled_c = mag_in/(255.0*stddev_arr[ci])
            delta_im[i,ci,:,:] = delta_im[i,ci,:,:].clone() * float(np.minimum(1.0, mag_in_scaled_c / l_inf_channel))

    return delta_im


def train(epoch):
    netG.train()
    for itr, (image, _) in enumerate([(torch.randn(2, 3, 8, 8), None)], 1):
        if opt.target == -1:
            # least likely class in nontargeted case
            pretrained_label_float = pretrained_clf(Variable(image))
            _, target_label = torch.min(pretrained_label_float, 1)

        image = Variable(image)

        ## generate per image perturbation from fixed noise
        delta_im = netG(image)

        delta_im = normalize_and_scale(delta_im, 'train')

        netG.zero_grad()

        recons = torch.add(image, delta_im)

        # do clamping per channel
        for cii in range(3):
            recons.data[:,cii,:,:] = recons.data[:,cii,:,:].clamp(image.data[:,cii,:,:].min(), image.data[:,cii,:,:].max())

        output_pretrained = pretrained_clf(recons)

        # attempt to get closer to least likely class, or target
        loss = torch.log(criterion_pre(output_pretrained, target_label))

        loss.backward()
        optimizerG.step()
        print("===> Epoch[{}]({}) loss: {:.4f}".format(epoch, itr, loss.item()))


train(1)
