# Reproduction of https://devgem.io/posts/understanding-pytorch-s-runtimeerror-backward-through-the-graph-a-second-time
# (a blog post: a model trained on features from an autoencoder fails with "Trying to backward through the graph a
# second time" on the second mini-batch, although loss.backward() runs once per batch: the features were encoded
# once with autograd on, so every slice hangs on the same autoencoder graph, which the first batch's backward freed.
# The post's fix wraps the encoding in torch.no_grad() ("This line is crucial"). The post's training loop and encoding
# lines as written; the two models, the data and the hand-over of the encoded features to X_train_tensor are filled
# in (the post does not show them; its print of X_train_tensor.requires_grad points at that hand-over)).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class AutoEncoder(nn.Module):
    def __init__(self, n_in, n_code):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(n_in, 16), nn.ReLU(), nn.Linear(16, n_code))
        self.decoder = nn.Sequential(nn.Linear(n_code, 16), nn.ReLU(), nn.Linear(16, n_in))

    def forward(self, x):
        encoded = self.encoder(x)
        loss = F.mse_loss(self.decoder(encoded), x)
        return encoded, loss


class Classifier(nn.Module):
    def __init__(self, n_in, n_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, 32), nn.ReLU(), nn.Linear(32, n_classes))

    def forward(self, x, y):
        out = self.net(x)
        loss = F.cross_entropy(out, y)
        accuracy = (out.argmax(dim=1) == y).float().mean()
        return out, loss, accuracy


X_train_tensor = torch.randn(64, 20)
y_train_tensor = torch.randint(0, 3, (64,))
X_val_tensor = torch.randn(16, 20)
X_test_tensor = torch.randn(16, 20)

autoencoder = AutoEncoder(20, 8)
autoencoder.eval()
X_train_encoded, loss = autoencoder(X_train_tensor)
X_val_encoded, loss = autoencoder(X_val_tensor)
X_test_encoded, loss = autoencoder(X_test_tensor)
X_train_tensor, X_val_tensor, X_test_tensor = X_train_encoded, X_val_encoded, X_test_encoded

model = Classifier(8, 3)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
max_iters = 2
batch_size = 16

for iter in range(max_iters):
    start_ix = 0
    loss = None

    while start_ix < len(X_train_tensor):
        loss = None
        end_ix = min(start_ix + batch_size, len(X_train_tensor))
        out, loss, accuracy = model(X_train_tensor[start_ix:end_ix], y_train_tensor[start_ix:end_ix])

        optimizer.zero_grad(set_to_none=True)
        print (iter, start_ix, X_train_tensor.requires_grad, y_train_tensor.requires_grad, loss.requires_grad)
        loss.backward()
        optimizer.step()
        start_ix = end_ix + 1
