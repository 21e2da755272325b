# Reproduction of https://github.com/AlexiaJM/Deep-learning-with-cats/issues/10 (a question on Meow_WGAN-GP.py: why
# the critic step calls backward three times (errD_real.backward(one_neg), errD_fake.backward(one), then
# grad_penalty.backward() on a penalty built with autograd.grad(create_graph=True)) instead of one backward of the sum;
# the author answers it computes the same gradients. A correct program: in-place LeakyReLU in D, x.data.copy_ and
# z.data.normal_ into reused input buffers between steps, double backward through D. The script's training loop and
# models as in the repository, shrunk (16x16 images, 8 hidden channels, random tensors instead of the cat dataset, CPU,
# no TensorBoard/image saving; `volatile` replaced by torch.no_grad(), backward(one) with 0-dim `one`, .data[0] by
# .item(), beta1's default written 0. so Adam gets two floats, as current PyTorch requires)).
import argparse
parser = argparse.ArgumentParser()
parser.add_argument('--image_size', type=int, default=16)
parser.add_argument('--batch_size', type=int, default=8)
parser.add_argument('--n_colors', type=int, default=3)
parser.add_argument('--z_size', type=int, default=16)
parser.add_argument('--G_h_size', type=int, default=8)
parser.add_argument('--D_h_size', type=int, default=8)
parser.add_argument('--lr_D', type=float, default=.0001, help='Discriminator learning rate')
parser.add_argument('--lr_G', type=float, default=.0001, help='Generator learning rate')
parser.add_argument('--n_iter', type=int, default=3, help='Number of iterations')
parser.add_argument('--n_critic', type=int, default=2, help='Number of training with D before training G')
parser.add_argument('--beta1', type=float, default=0., help='Adam betas[0], WGAN-GP paper recommends 0')
parser.add_argument('--beta2', type=float, default=.9, help='Adam betas[1], WGAN-GP paper recommends .90')
parser.add_argument('--penalty', type=float, default=10, help='Gradient penalty parameter for WGAN-GP')
parser.add_argument('--SELU', type=bool, default=False)
param = parser.parse_args([])

import torch
from torch.autograd import Variable

torch.manual_seed(0)


# Generate a random sample
def generate_random_sample():
	while True:
		yield torch.rand(param.batch_size, param.n_colors, param.image_size, param.image_size) * 2 - 1
random_sample = generate_random_sample()


# DCGAN generator
class DCGAN_G(torch.nn.Module):
	def __init__(self):
		super(DCGAN_G, self).__init__()
		main = torch.nn.Sequential()

		# We need to know how many layers we will use at the beginning
		mult = param.image_size // 8

		### Start block
		main.add_module('Start-ConvTranspose2d', torch.nn.ConvTranspose2d(param.z_size, param.G_h_size * mult, kernel_size=4, stride=1, padding=0, bias=False))
		if param.SELU:
			main.add_module('Start-SELU', torch.nn.SELU(inplace=True))
		else:
			main.add_module('Start-BatchNorm2d', torch.nn.BatchNorm2d(param.G_h_size * mult))
			main.add_module('Start-ReLU', torch.nn.ReLU())

		### Middle block (Done until we reach ? x image_size/2 x image_size/2)
		i = 1
		while mult > 1:
			main.add_module('Middle-ConvTranspose2d [%d]' % i, torch.nn.ConvTranspose2d(param.G_h_size * mult, param.G_h_size * (mult//2), kernel_size=4, stride=2, padding=1, bias=False))
			if param.SELU:
				main.add_module('Middle-SELU [%d]' % i, torch.nn.SELU(inplace=True))
			else:
				main.add_module('Middle-BatchNorm2d [%d]' % i, torch.nn.BatchNorm2d(param.G_h_size * (mult//2)))
				main.add_module('Middle-ReLU [%d]' % i, torch.nn.ReLU())
			mult = mult // 2
			i += 1

		### End block
		main.add_module('End-ConvTranspose2d', torch.nn.ConvTranspose2d(param.G_h_size, param.n_colors, kernel_size=4, stride=2, padding=1, bias=False))
		main.add_module('End-Tanh', torch.nn.Tanh())
		self.main = main

	def forward(self, input):
		output = self.main(input)
		return output


# DCGAN discriminator (using somewhat the reverse of the generator)
# Removed Batch Norm we can't backward on the gradients with BatchNorm2d
class DCGAN_D(torch.nn.Module):
	def __init__(self):
		super(DCGAN_D, self).__init__()
		main = torch.nn.Sequential()

		### Start block
		main.add_module('Start-Conv2d', torch.nn.Conv2d(param.n_colors, param.D_h_size, kernel_size=4, stride=2, padding=1, bias=False))
		if param.SELU:
			main.add_module('Start-SELU', torch.nn.SELU(inplace=True))
		else:
			main.add_module('Start-LeakyReLU', torch.nn.LeakyReLU(0.2, inplace=True))
		image_size_new = param.image_size // 2

		### Middle block (Done until we reach ? x 4 x 4)
		mult = 1
		i = 0
		while image_size_new > 4:
			main.add_module('Middle-Conv2d [%d]' % i, torch.nn.Conv2d(param.D_h_size * mult, param.D_h_size * (2*mult), kernel_size=4, stride=2, padding=1, bias=False))
			if param.SELU:
				main.add_module('Middle-SELU [%d]' % i, torch.nn.SELU(inplace=True))
			else:
				main.add_module('Middle-LeakyReLU [%d]' % i, torch.nn.LeakyReLU(0.2, inplace=True))
			image_size_new = image_size_new // 2
			mult = mult*2
			i += 1

		### End block
		main.add_module('End-Conv2d', torch.nn.Conv2d(param.D_h_size * mult, 1, kernel_size=4, stride=1, padding=0, bias=False))
		# Note: No more sigmoid in WGAN, we take the mean now
		self.main = main

	def forward(self, input):
		output = self.main(input)
		# Convert from batch_size x 1 x 1 to batch_size
		return output.view(-1)


## Weights init function, DCGAN use 0.02 std
def weights_init(m):
	classname = m.__class__.__name__
	if classname.find('Conv') != -1:
		m.weight.data.normal_(0.0, 0.02)
	elif classname.find('BatchNorm') != -1:
		# Estimated variance, must be around 1
		m.weight.data.normal_(1.0, 0.02)
		# Estimated mean, must be around 0
		m.bias.data.fill_(0)


## Initialization
G = DCGAN_G()
D = DCGAN_D()

# Initialize weights
G.apply(weights_init)
D.apply(weights_init)

# Soon to be variables
x = torch.FloatTensor(param.batch_size, param.n_colors, param.image_size, param.image_size)
# Weighted sum of fake and real image, for gradient penalty
x_both = torch.FloatTensor(param.batch_size, param.n_colors, param.image_size, param.image_size)
z = torch.FloatTensor(param.batch_size, param.z_size, 1, 1)
# Uniform weight
u = torch.FloatTensor(param.batch_size, 1, 1, 1)
# For the gradients, we need to specify which one we want and want them all
grad_outputs = torch.ones(param.batch_size)
one = torch.tensor(1.)
one_neg = one * -1

# Now Variables
x = Variable(x)
z = Variable(z)

# Optimizer
optimizerD = torch.optim.Adam(D.parameters(), lr=param.lr_D, betas=(param.beta1, param.beta2))
optimizerG = torch.optim.Adam(G.parameters(), lr=param.lr_G, betas=(param.beta1, param.beta2))

## Fitting model
for i in range(param.n_iter):

	for p in D.parameters():
		p.requires_grad = True

	for t in range(param.n_critic):

		########################
		# (1) Update D network #
		########################

		D.zero_grad()

		# Sample real data
		real_images = random_sample.__next__()
		x.data.copy_(real_images)
		# Discriminator Loss real
		errD_real = D(x)
		errD_real = errD_real.mean()
		errD_real.backward(one_neg)

		# Sample fake data
		z.data.normal_(0, 1)
		with torch.no_grad():
			z_volatile = Variable(z.data)
			x_fake = Variable(G(z_volatile).data)
		# Discriminator Loss fake
		errD_fake = D(x_fake)
		errD_fake = errD_fake.mean()
		errD_fake.backward(one)

		# Gradient penalty
		u.uniform_(0, 1)
		x_both = x.data*u + x_fake.data*(1-u)
		# We only want the gradients with respect to x_both
		x_both = Variable(x_both, requires_grad=True)
		grad = torch.autograd.grad(outputs=D(x_both), inputs=x_both, grad_outputs=grad_outputs, retain_graph=True, create_graph=True, only_inputs=True)[0]
		# We need to norm 3 times (over n_colors x image_size x image_size) to get only a vector of size "batch_size"
		grad_penalty = param.penalty*((grad.norm(2, 1).norm(2,1).norm(2,1) - 1) ** 2).mean()
		grad_penalty.backward()
		# Optimize
		errD_penalty = errD_fake - errD_real + grad_penalty
		errD = errD_fake - errD_real
		optimizerD.step()

	#########################
	# (2) Update G network: #
	#########################
	for p in D.parameters():
		p.requires_grad = False

	G.zero_grad()

	# Sample fake data
	z.data.normal_(0, 1)
	x_fake = G(z)
	# Generator Loss
	errG = D(x_fake)
	errG = errG.mean()
	errG.backward(one_neg)
	optimizerG.step()

	print('[i=%d] W_distance: %.4f W_distance_penalty: %.4f Loss_G: %.4f' % (i, errD.item(), errD_penalty.item(), errG.item()))
