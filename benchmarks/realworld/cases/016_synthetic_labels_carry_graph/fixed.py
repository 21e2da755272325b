# Reproduction of https://github.com/zhangyu2234/Deep-learning-by-hand (README, "Problems": backward through the graph a second time).
import torch

torch.manual_seed(0)


def relu(x):
    return torch.max(x, torch.zeros_like(x))


def loss(y_hat, y):
    return ((y_hat - y.reshape(y_hat.shape)) ** 2 / 2).sum()


def sgd(params, lr, batch_size):
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


def DataLoader(X, Y, batch_size, shuffle=True):
    indices = torch.randperm(len(X)) if shuffle else torch.arange(len(X))
    for i in range(0, len(X), batch_size):
        j = indices[i:i + batch_size]
        yield X[j], Y[j]


num_samples = 100
num_features = 2
num_hiddens = 2
X = torch.randn((num_samples, num_features), dtype=torch.float32)
true_W = torch.randn((num_hiddens, 1), requires_grad=True, dtype=torch.float32)
true_b = torch.randn(1, requires_grad=True, dtype=torch.float32)
Y = (torch.mm(X, true_W) + true_b).detach()


def fc(x, w, b):
    return relu(torch.mm(x, w) + b)


W = torch.normal(0, 0.01, size=(num_hiddens, 1), requires_grad=True)
b = torch.zeros(1, requires_grad=True)
batch_size = 20
lr = 0.01
num_epochs = 2
for epoch in range(num_epochs):
    dataloader = DataLoader(X, Y, batch_size, shuffle=True)
    for x, y in dataloader:
        l = loss(fc(x, W, b), y)
        l.backward()
        sgd([W, b], lr, batch_size)
print(W.detach().flatten())
