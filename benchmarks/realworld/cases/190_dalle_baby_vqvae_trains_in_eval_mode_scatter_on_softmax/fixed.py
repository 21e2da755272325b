# Reproduction of https://github.com/yashbonde/dall-e-baby/issues/1 (training the discrete VAE of dall-e-baby fails at
# the step after the first test pass with "one of the variables needed for gradient computation has been modified by
# an inplace operation" (anomaly mode: "Error detected in SoftmaxBackward"): DiscreteVAETrainer.train switches the
# model to eval() for testing and only calls model.train() again inside the save_every branch, so training resumes in
# eval mode, where VQVAE_v3.forward takes softmax = F.softmax(encoding) and then softmax.scatter_(...) in place on the
# softmax output that SoftmaxBackward saved. The author's fix (b6f283f) calls model.train() after every test pass. The
# repository's ResidualLayer, QuickGELU, VQVAE_Encoder_v2/Decoder_v2, VQVAE_v3 and DiscreteVAETrainer.train at the
# issue's date, shrunk (hidden_dims [8, 16], 16 codes of size 8, 16x16 random images, test_every=1, save_every=None);
# tqdm's trange written as range, wandb, plotting and torch.save left out, DataLoader without workers).
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import einsum
from torch.utils.data import Dataset, DataLoader

torch.manual_seed(0)


class RandomImages(Dataset):
  def __init__(self, n):
    self.images = torch.rand(n, 3, 16, 16) * 2 - 1

  def __len__(self):
    return len(self.images)

  def __getitem__(self, i):
    return self.images[i]


# ----- model
class ResidualLayer(nn.Module):
  def __init__(self, in_channels, out_channels):
    super(ResidualLayer, self).__init__()
    self.resblock = nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.LeakyReLU(inplace=True),
        nn.Conv2d(out_channels, out_channels, kernel_size=1, bias=False),
        nn.BatchNorm2d(out_channels),
    )

  def forward(self, input):
    return input + self.resblock(input)


class QuickGELU(nn.Module):
  # https://github.com/openai/CLIP/blob/main/clip/model.py
  def forward(self, x):
    return x * torch.sigmoid(1.702 * x)


class VQVAE_Encoder_v2(nn.Module):
  def __init__(self, in_channels, hidden_dims, num_embeddings, add_residual=True, **kwargs):
    super().__init__()
    modules = []
    for h_dim in hidden_dims:
      modules.append(nn.Sequential(
        nn.Conv2d(in_channels, out_channels=h_dim, kernel_size=4, stride=2, padding=1),
        nn.BatchNorm2d(h_dim),
        QuickGELU()
      ))
      in_channels = h_dim
      if add_residual:
        modules.append(ResidualLayer(in_channels, in_channels))
        modules.append(QuickGELU())

    modules.append(nn.Sequential(
        nn.Conv2d(in_channels, num_embeddings, kernel_size=1, stride=1),
    ))

    self.encoder = nn.Sequential(*modules)

  def forward(self, x):
    return self.encoder(x)


class VQVAE_Decoder_v2(nn.Module):
  def __init__(self, embedding_dim, hidden_dims, out_channels, add_residual=True, **kwargs):
    super().__init__()
    modules = []
    modules.append(nn.Sequential(
      nn.ConvTranspose2d(embedding_dim, hidden_dims[-1], kernel_size=3, stride=1, padding=1),
      nn.BatchNorm2d(hidden_dims[-1]),
      QuickGELU()
    ))
    hidden_dims.reverse()
    hidden_dims = hidden_dims + [out_channels]  # add the last layer in it

    last = len(hidden_dims) - 1
    for i in range(last):
      if add_residual:
        modules.append(ResidualLayer(hidden_dims[i], hidden_dims[i]))
        modules.append(QuickGELU())

      # we need a tanh activation for the last layer not LReLU
      if i != last-1:
        modules.append(nn.Sequential(
          nn.ConvTranspose2d(hidden_dims[i], hidden_dims[i + 1], kernel_size=4, stride=2, padding=1),
          nn.BatchNorm2d(hidden_dims[i + 1]),
          QuickGELU()
        ))
      else:
        modules.append(nn.Sequential(
          nn.ConvTranspose2d(hidden_dims[i], hidden_dims[i + 1], kernel_size=4, stride=2, padding=1),
          nn.Tanh()
        ))

    self.decoder = nn.Sequential(*modules)

  def forward(self, x):
    return self.decoder(x)


class VQVAE_v3(nn.Module):
  def __init__(self, in_channels: int, embedding_dim: int, num_embeddings: int, hidden_dims=[128, 256],
               add_residual=True, **kwargs):
    super().__init__()

    self.embedding_dim=embedding_dim
    self.num_embeddings=num_embeddings

    self.encoder = VQVAE_Encoder_v2(
      in_channels=in_channels,
      hidden_dims=hidden_dims,
      embedding_dim=embedding_dim,
      num_embeddings=num_embeddings,
      add_residual=add_residual,
    )
    self.codebook = nn.Embedding(num_embeddings, embedding_dim)
    self.decoder = VQVAE_Decoder_v2(
      embedding_dim=embedding_dim,
      hidden_dims=hidden_dims,
      out_channels=in_channels,
      add_residual=add_residual,
    )

  def forward(self, input, v=False):
    # first step is to pass the image through encoder and get the embeddings
    encoding=self.encoder(input)

    if self.training:
      softmax = F.gumbel_softmax(encoding, tau = 1., hard = True, dim = 1)
    else:
      # during testing we can ignore this added noise and go for standard softmax
      # now this does not give use the exact sharp values that hard-gumbel gives but
      # is still usable.
      softmax = F.softmax(encoding, dim = 1)

      # we can also improve this by introducing the argmax method, since we know that
      # during testing we do not need the gradient we can get away with it. We simply
      # create the same shape as we would get in the Gumbel distribution
      softmax = softmax.scatter_(1, torch.argmax(softmax, dim = 1).unsqueeze(1), 1)

    # we can also convert the softmax distribution to argmax and identify the final ids
    # to use for language model
    encoding_ids = torch.argmax(softmax, dim = 1).view(encoding.size(0), -1)

    # now just like conventional embedding we tell the model to fill the hard indices
    # with the values from a learnable embedding matrix.
    quantized_inputs = einsum("bdhw,dn->bnhw", softmax, self.codebook.weight)

    # we pass the embedding through decoder that is supposed to recreate the image
    recons=self.decoder(quantized_inputs)
    recons_loss=F.mse_loss(recons, input)
    loss = recons_loss # + vq_loss
    return encoding_ids, loss, recons


# ------- trainer
class DiscreteVAETrainer:
  def __init__(self, model, train, test=None):
    self.model=model
    self.train_dataset=train
    self.test_dataset=test
    self.device="cpu"

  def save_checkpoint(self, ckpt_path=None):
    print(f"Saving Model at {ckpt_path}")  # torch.save left out

  def train(
      self, bs, n_epochs, lr, folder_path, skip_steps,
      test_every=500, test_batch_size=None, save_every=None,
      **kwargs
    ):
    model=self.model
    train_data=self.train_dataset
    test_data=self.test_dataset
    epoch_step=len(train_data) // bs + int(len(train_data) % bs != 0)
    optim=torch.optim.Adam(model.parameters(), lr=lr)
    gs=0
    train_losses=[-1]
    model.train()
    do_skip = True
    for epoch in range(n_epochs):
      # ----- train for one complete epoch
      dl=DataLoader(dataset=train_data, batch_size=bs, shuffle=True)
      pbar=range(epoch_step)
      for d, loop_idx in zip(dl, pbar):
        if skip_steps and loop_idx < skip_steps and do_skip:
          continue
        do_skip = False

        # train the model
        d=d.to(self.device)
        print(f"[TRAIN - {epoch}] GS: {gs}, Loss: {round(train_losses[-1], 5)}")
        _, loss, _=model(d)
        loss=loss.mean() # gather from multiple GPUs

        # gradient clipping
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.5)
        optim.step()
        gs += 1
        train_losses.append(loss.item())

        # ----- test condition
        if test_data != None and gs and gs % test_every == 0:
          print(":: Entering Testing Mode")
          if test_batch_size is None:
            test_batch_size = bs * 4
          dl=DataLoader(dataset=test_data, batch_size=test_batch_size, shuffle=False)
          model=model.eval() # convert model to testing mode
          epoch_step_test=len(test_data) // test_batch_size + int(len(test_data) % test_batch_size != 0)
          pbar_test=range(epoch_step_test)
          test_loss=[]
          for d, e in zip(dl, pbar_test):
            d=d.to(self.device)
            with torch.no_grad():
              _, loss, output_img=model(d)
            loss=loss.mean() # gather from multiple GPUs
            test_loss.append(loss.item())

          test_loss=np.mean(test_loss)
          print(":::: Loss:", test_loss)

        if gs and save_every and gs % save_every == 0:
          self.save_checkpoint(ckpt_path=f"{folder_path}/vae_{gs}.pt")
        # ------ testing ends
        model.train()  # convert model back to training mode

    print("EndSave")


model = VQVAE_v3(in_channels=3, embedding_dim=8, num_embeddings=16, hidden_dims=[8, 16], add_residual=True)
trainer = DiscreteVAETrainer(model, RandomImages(16), RandomImages(8))
trainer.train(bs=4, n_epochs=1, lr=1e-3, folder_path=".", skip_steps=0, test_every=1, test_batch_size=8,
              save_every=None)
