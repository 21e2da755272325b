# gradguard run --html report.html examples/integrations/html_report_demo.py
# The GAN ordering bug: the discriminator is stepped before the generator's loss has been backpropagated
# through it, so the generator's backward finds the discriminator's weights already updated in place.
import torch
from torch import nn

torch.manual_seed(0)
generator = nn.Linear(4, 4)
discriminator = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt_d = torch.optim.SGD(discriminator.parameters(), lr=0.1)
opt_g = torch.optim.SGD(generator.parameters(), lr=0.1)

fake = generator(torch.randn(16, 4))
d_loss = discriminator(fake.detach()).mean()
g_loss = -discriminator(fake).mean()

opt_d.zero_grad()
d_loss.backward()
opt_d.step()  # updates the discriminator's weights in place
opt_g.zero_grad()
g_loss.backward()  # ... but g_loss's graph saved the old ones
opt_g.step()
