# Reproduction of https://discuss.pytorch.org/t/if-two-different-way-to-modify-grad-manually-is-equivalent/81640 (the
# poster's demo script, as posted: it compares a gradient hook with editing weight.grad.data, but calls out.backward()
# a second time on the `out` whose graph the first backward already freed).
import torch
import torch.nn as nn
batch_size = 8


class ModifyGrad(nn.Module):
    def __init__(self):
        super(ModifyGrad, self).__init__()
        self.fc = nn.Linear(100, 10)

    def forward(self, x):
        return self.fc(x)


model = ModifyGrad()
optimizer = torch.optim.SGD(model.parameters(), 0.1,
                            momentum=0.09, weight_decay=0.0001)
x = torch.randn(batch_size, 100)
out = model(x).mean()
# modify grad by hook
h = model.fc.weight.register_hook(lambda grad: grad + 0.1)
model.zero_grad()
out.backward()
optimizer.step()
# modify grad by set weight.grad.data directly
model.zero_grad()
out.backward()
model.fc.weight.grad.data = model.fc.weight.grad.data + 0.1
optimizer.step()
