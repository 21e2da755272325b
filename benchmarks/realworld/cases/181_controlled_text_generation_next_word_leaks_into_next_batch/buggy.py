# Reproduction of https://github.com/GBLin5566/toward-controlled-generation-of-text-pytorch/issues/8 (training the
# attribute-controlled text VAE of Hu et al. with train_vae_with_attr_loss fails on the second batch with "Trying to
# backward through the graph a second time" at total_vae_loss.backward(): the decoding loop decides whether to start
# from the BOS one-hot with `if 'next_word' in locals():`, but next_word is still a local left over from the previous
# batch, so the new batch's first decoder input is the previous batch's last softmax output, whose graph that batch's
# backward freed. Model/Modules.py (Encoder, Generator, Discriminator), Model/Constants.py, utils.check_cuda and
# train.py's train_vae_with_attr_loss at the reported revision; sizes shrunk (vocabulary 200, sequences of 6 tokens,
# batches of 4, hidden sizes 16/24), IMDB replaced by random token ids and labels, train_vae / train_discriminator
# (not called) dropped, the legacy loss.data[0] written loss.item() and Variable(..., volatile=...) without volatile;
# PyTorch's warnings about the implicit softmax dim and LSTM dropout with one layer are the library's own).
import numpy as np
import torch
import torch.nn as nn
from torch.autograd import Variable
import torch.nn.functional as F
from torch.optim import Adam

torch.manual_seed(0)
np.random.seed(0)


class Constants:  # Model/Constants.py
    PAD = 0
    UNK = 1
    BOS = 2
    EOS = 3


def check_cuda(torch_var, use_cuda=False):  # utils.py
    if use_cuda and torch.cuda.is_available():
        return torch_var.cuda()
    else:
        return torch_var


class Encoder(nn.Module):
    '''A LSTM encoder to encode a sentence into a latent vector z.'''
    def __init__(
            self,
            n_src_vocab,
            n_layers=1,
            d_word_vec=16,
            d_inner_hid=24,
            dropout=0.1,
            d_out_hid=24,
            use_cuda=False,
            ):
        super(Encoder, self).__init__()

        self.drop = nn.Dropout(dropout)
        self.src_word_emb = nn.Embedding(n_src_vocab, d_word_vec, padding_idx=Constants.PAD)

        self.n_layers = n_layers
        self.d_inner_hid = d_inner_hid
        self.use_cuda = use_cuda

        # NOTE:Maybe try GRU
        self.rnn = nn.LSTM(d_word_vec, d_inner_hid, n_layers, dropout=dropout)

        # For generating Gaussian distribution
        self._enc_mu = nn.Linear(d_inner_hid, d_out_hid)
        self._enc_log_sigma = nn.Linear(d_inner_hid, d_out_hid)

        self.init_weights()

    # Borrow from https://github.com/ethanluoyc/pytorch-vae/blob/master/vae.py
    def _sample_latent(self, enc_hidden):
        mu = self._enc_mu(enc_hidden)
        log_sigma = self._enc_log_sigma(enc_hidden)
        sigma = torch.exp(log_sigma)
        std_z = torch.from_numpy(np.random.normal(0, 1, size=sigma.size())).float()

        self.z_mean = mu
        self.z_sigma = sigma

        std_z_var = Variable(std_z, requires_grad=False)
        std_z_var = check_cuda(std_z_var, self.use_cuda)
        return mu + sigma * std_z_var

    def forward(self, src_seq, hidden, dont_pass_emb=False):
        if dont_pass_emb:
            enc_input = self.drop(src_seq)
        else:
            enc_input = self.drop(self.src_word_emb(src_seq))
        # Reshape tensor's shape to (d_word_vec, batch_size, d_inner_hid)
        enc_input = enc_input.permute(1, 0, 2)
        _, hidden = self.rnn(enc_input, hidden)
        hidden = (
                self._sample_latent(hidden[0]),
                hidden[1]
                )
        return hidden

    def init_hidden(self, batch_size):
        # NOTE: LSTM needs 2 hidden states
        hidden = [
            Variable(torch.zeros(self.n_layers, batch_size, self.d_inner_hid)),
            Variable(torch.zeros(self.n_layers, batch_size, self.d_inner_hid))
            ]
        hidden[0] = check_cuda(hidden[0], self.use_cuda)
        hidden[1] = check_cuda(hidden[1], self.use_cuda)
        return hidden

    def init_weights(self):
        initrange = 0.1
        self.src_word_emb.weight.data.uniform_(-initrange, initrange)
        self._enc_mu.weight.data.uniform_(-initrange, initrange)
        self._enc_log_sigma.weight.data.uniform_(-initrange, initrange)


class Generator(nn.Module):
    '''A LSTM generator to synthesis a sentence with input (z, c)
       where z is a latent vector from encoder and c is attribute code.
    '''
    def __init__(
            self,
            n_target_vocab,
            n_layers=1,
            d_word_vec=16,
            d_inner_hid=24,
            c_dim=1,
            dropout=0.1,
            use_cuda=False,
            ):
        super(Generator, self).__init__()

        self.drop = nn.Dropout(dropout)

        self.d_inner_hid = d_inner_hid
        self.c_dim = c_dim
        self.n_layers = n_layers
        self.use_cuda = use_cuda

        self.target_word_emb = nn.Embedding(
            n_target_vocab, d_word_vec, padding_idx=Constants.PAD)

        self.rnn = nn.LSTM(d_word_vec, d_inner_hid + c_dim, n_layers, dropout=dropout)

        self.to_word_emb = nn.Sequential(
                nn.Linear(d_inner_hid + c_dim, d_word_vec),
                nn.ReLU()
                )
        self.linear = nn.Linear(d_word_vec, n_target_vocab)
        # Speicial embbeding for cold temperature trick
        self.one_hot_to_word_emb = nn.Linear(n_target_vocab, d_word_vec)
        # Share embbedding weight
        self.linear.weight = self.target_word_emb.weight
        self.one_hot_to_word_emb.weight = torch.nn.Parameter(self.linear.weight.permute(1, 0).data)

        self.softmax = nn.Softmax()

        self.init_weights()

    def forward(self, target_word, hidden, low_temp=False, one_hot_input=False):
        ''' hidden is composed of z and c '''
        ''' input is word-by-word in Generator '''
        if one_hot_input:
            dec_input = self.drop(
                self.one_hot_to_word_emb(target_word)).unsqueeze(0)
        else:
            dec_input = self.drop(
                self.target_word_emb(target_word)).unsqueeze(0)
        output, hidden = self.rnn(dec_input, hidden)
        output = self.to_word_emb(output)
        output = self.linear(output)
        # Low temperature factor trick
        if low_temp:
            pre_soft = output[0]
            lowed_output = pre_soft / 0.001
            output = self.softmax(lowed_output)
            return output, hidden, pre_soft
        return output, hidden

    def init_hidden_c_for_lstm(self, batch_size):
        hidden = Variable(torch.zeros(self.n_layers, batch_size, self.d_inner_hid))
        hidden = check_cuda(hidden, self.use_cuda)
        return hidden

    def init_weights(self):
        initrange = 0.1
        self.target_word_emb.weight.data.uniform_(-initrange, initrange)
        self.to_word_emb[0].weight.data.uniform_(-initrange, initrange)
        self.linear.weight.data.uniform_(-initrange, initrange)


class Discriminator(nn.Module):
    '''A CNN discriminator to classify the attributes given a sentence.'''
    def __init__(
            self,
            n_src_vocab,
            maxlen,
            d_word_vec=16,
            dropout=0.1,
            use_cuda=False,
            ):
        super(Discriminator, self).__init__()

        self.use_cuda = use_cuda

        self.src_word_emb = nn.Embedding(n_src_vocab, d_word_vec, padding_idx=Constants.PAD)
        self.drop = nn.Dropout(dropout)
        self.conv1 = nn.Conv1d(maxlen, 8, kernel_size=5)
        self.conv2 = nn.Conv1d(8, 8, kernel_size=5)
        self.conv3 = nn.Conv1d(8, 8, kernel_size=5)
        self.softmax = nn.LogSoftmax()

    def forward(self, input_sentence, is_softmax=False, dont_pass_emb=False):
        if dont_pass_emb:
            emb_sentence = input_sentence
        else:
            emb_sentence = self.src_word_emb(input_sentence)
        relu1 = F.relu(self.conv1(emb_sentence))
        layer1 = F.max_pool1d(relu1, 3)
        relu2 = F.relu(self.conv2(layer1))
        layer2 = F.max_pool1d(relu2, 3)
        layer3 = F.max_pool1d(F.relu(self.conv2(layer2)), 10)
        flatten = self.drop(layer2.view(layer3.size()[0], -1))
        if not hasattr(self, 'linear'):
            self.linear = nn.Linear(flatten.size()[1], 2)
            self.linear = check_cuda(self.linear, self.use_cuda)
        logit = self.linear(flatten)
        if is_softmax:
            logit = self.softmax(logit)
        return logit


# train.py
max_features = 200
maxlen = 6
batch_size = 4
epoch = 1
c_dim = 2
lambda_c = 0.1
lambda_z = 0.1
use_cuda = False

# random token ids and binary labels instead of keras' IMDB
x_train = np.random.randint(Constants.EOS + 1, max_features, size=(3 * batch_size, maxlen))
x_train[:, 0] = Constants.BOS
y_train = np.random.randint(0, 2, size=3 * batch_size)


def get_batch_label(data, label, index, batch_size, testing=False):
    tensor = torch.from_numpy(data[index:index+batch_size]).type(torch.LongTensor)
    input_data = Variable(tensor, requires_grad=False)
    input_data = check_cuda(input_data, use_cuda)
    label_tensor = torch.from_numpy(label[index:index+batch_size]).type(torch.LongTensor)
    output_data = Variable(label_tensor, requires_grad=False)
    output_data = check_cuda(output_data, use_cuda)
    return input_data, output_data


# Borrow from https://github.com/ethanluoyc/pytorch-vae/blob/master/vae.py
def latent_loss(z_mean, z_stddev):
    mean_sq = z_mean * z_mean
    stddev_sq = z_stddev * z_stddev
    return 0.5 * torch.mean(mean_sq + stddev_sq - torch.log(stddev_sq) - 1)


# Make instances
encoder = Encoder(
        n_src_vocab=max_features,
        use_cuda=use_cuda,
        )
decoder = Generator(
        n_target_vocab=max_features,
        c_dim=c_dim,
        use_cuda=use_cuda,
        )
discriminator = Discriminator(
        n_src_vocab=max_features,
        maxlen=maxlen,
        use_cuda=use_cuda,
        )
encoder = check_cuda(encoder, use_cuda)
decoder = check_cuda(decoder, use_cuda)
discriminator = check_cuda(discriminator, use_cuda)
criterion = torch.nn.CrossEntropyLoss()
vae_parameters = list(encoder.parameters()) + list(decoder.parameters())
vae_opt = Adam(vae_parameters)
e_opt = Adam(encoder.parameters())
g_opt = Adam(decoder.parameters())
d_opt = Adam(discriminator.parameters())


def train_vae_with_attr_loss(encoder, decoder, discriminator):
    for epoch_index in range(epoch):
        for batch, index in enumerate(range(0, len(x_train) - 1, batch_size)):
            encoder.zero_grad()
            decoder.zero_grad()
            e_opt.zero_grad()
            g_opt.zero_grad()
            vae_loss = 0
            ll = 0

            input_data, output_data = get_batch_label(x_train, y_train, index, batch_size)

            enc_hidden = encoder.init_hidden(len(input_data))
            enc_hidden = encoder(input_data, enc_hidden)

            target = np.array([output_data.cpu().data.numpy()]).reshape(-1)
            one_hot_array = np.eye(c_dim)[target]
            c = torch.from_numpy(one_hot_array).float()
            var_c = Variable(c, requires_grad=False)
            var_c = check_cuda(var_c, use_cuda)
            # TODO: use iteration along first dim.
            cat_hidden = (torch.cat([enc_hidden[0][0], var_c], dim=1).unsqueeze(0),
                    torch.cat([decoder.init_hidden_c_for_lstm(len(input_data))[0], var_c], dim=1).unsqueeze(0))

            batch_init_word = np.zeros((batch_size, max_features))
            batch_init_word[np.arange(batch_size), Constants.BOS] = 1
            batch_init_word = Variable(torch.from_numpy(batch_init_word), requires_grad=False).float()
            batch_init_word = check_cuda(batch_init_word, use_cuda)

            input_data = input_data.permute(1, 0)
            for index in range(maxlen - 1):
                if 'next_word' in locals():
                    word = next_word.squeeze(1)
                    word = check_cuda(word, use_cuda)
                    output, cat_hidden, pre_soft = decoder(
                            word,
                            cat_hidden,
                            low_temp=True,
                            one_hot_input=True
                            )
                else:
                    word = batch_init_word
                    word = check_cuda(word, use_cuda)
                    output, cat_hidden, pre_soft = decoder(
                            word,
                            cat_hidden,
                            low_temp=True,
                            one_hot_input=True
                            )
                # From one-hot to word embedding
                next_word = output
                correct_word = input_data[index+1]
                vae_loss += criterion(pre_soft.view(-1, max_features), correct_word)
                if len(batch_init_word.size()) == 2:
                    batch_init_word = batch_init_word.unsqueeze(1)
                if len(next_word.size()) == 2:
                    next_word = next_word.unsqueeze(1)
                batch_init_word = torch.cat([batch_init_word, next_word], dim=1)
            # NOTE Latent loss
            ll = latent_loss(encoder.z_mean, encoder.z_sigma)
            # NOTE L_attr_c loss
            generated_sentence = batch_init_word
            discriminator.eval()
            logit = discriminator(generated_sentence, dont_pass_emb=True)
            l_attr_c = criterion(logit, output_data)
            # NOTE L_attr_z loss
            encoder.eval()
            generated_sentence = decoder.one_hot_to_word_emb(generated_sentence)
            encoded_gen = encoder.init_hidden(len(generated_sentence))
            encoded_gen = encoder(generated_sentence, encoded_gen, dont_pass_emb=True)
            l_attr_z = latent_loss(encoder.z_mean, encoder.z_sigma)

            avg_loss = vae_loss.item() / maxlen

            total_vae_loss = vae_loss + ll
            extra_decoder_loss = lambda_c * l_attr_c + lambda_z * l_attr_z
            total_vae_loss.backward()
            #e_opt.step()
            #extra_decoder_loss.backward()
            #g_opt.step()
            vae_opt.step()

            if batch % 25 == 0:
                print("[Attr] Epoch {} batch {}'s average language loss: {}, latent loss: {}".format(
                    epoch_index,
                    batch,
                    avg_loss,
                    ll.item(),
                    ))
                print("l_attr_c loss: {}, l_attr_z loss: {}".format(
                    l_attr_c.item(),
                    l_attr_z.item(),
                    ))


train_vae_with_attr_loss(encoder, decoder, discriminator)
