# Reproduction of https://discuss.pytorch.org/t/how-to-implement-accumulated-gradient/3822 (a PyTorch forum thread on
# Caffe-style iter_size gradient accumulation; an answer's second implementation calls loss.backward() on
# each mini-batch loss divided by iter_size, sums the losses for logging with loss_sum += loss, and steps the
# optimizer once per iter_size mini-batches. A correct program: each graph is backpropagated once and the in-place
# loss_sum += loss touches no tensor saved for backward. The answer's loop in a small training script on random
# tensors; a tiny MLP stands in for the user's network).
import torch
import torch.nn as nn

torch.manual_seed(0)

model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

old_mini_batch_size = 16
iter_size = 4
minibatch_size = old_mini_batch_size // iter_size
inputs = torch.randn(64, 10)
targets = torch.randint(0, 3, (64,))

for step in range(0, len(inputs), old_mini_batch_size):
    optimizer.zero_grad()
    loss_sum = 0
    for i in range(iter_size):
        start = step + i * minibatch_size
        input_var = inputs[start:start + minibatch_size]
        target_var = targets[start:start + minibatch_size]
        output = model(input_var)
        loss = criterion(output, target_var) / iter_size
        loss.backward()
        loss_sum += loss
    optimizer.step()
    print(f"step {step // old_mini_batch_size}: loss {loss_sum.item():.4f}")
