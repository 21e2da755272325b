# Reproduction of https://github.com/pytorch/pytorch/issues/55368 (the script, as posted).
import torch

torch.manual_seed(0)
model = torch.nn.utils.spectral_norm(torch.nn.Linear(2, 5))
opt1 = torch.optim.SGD(model.parameters(), lr=1e-3)
opt2 = torch.optim.SGD(model.parameters(), lr=1e-3)

x = torch.randn(7, 2)
output = model(x)
loss = output.abs().mean()

opt1.zero_grad(); loss.backward(retain_graph=True); opt1.step()  # first propagation
output = model(x)
loss = output.abs().mean()
opt2.zero_grad(); loss.backward(); opt2.step()  # second
print(loss.item())
