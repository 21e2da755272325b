# Correct program: optimize_model() from https://pytorch.org/tutorials/intermediate/reinforcement_q_learning.html (older revision, shrunk).
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

torch.manual_seed(0)
GAMMA, BATCH_SIZE = 0.99, 6
policy_net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
target_net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
target_net.load_state_dict(policy_net.state_dict())
target_net.eval()
optimizer = optim.RMSprop(policy_net.parameters())


def optimize_model(state_batch, action_batch, reward_batch, next_states, non_final_mask):
    state_action_values = policy_net(state_batch).gather(1, action_batch)
    next_state_values = torch.zeros(BATCH_SIZE)
    next_state_values[non_final_mask] = target_net(next_states).max(1)[0].detach()
    expected_state_action_values = (next_state_values * GAMMA) + reward_batch
    loss = F.smooth_l1_loss(state_action_values, expected_state_action_values.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    for param in policy_net.parameters():
        param.grad.data.clamp_(-1, 1)
    optimizer.step()
    return loss


for i in range(3):
    mask = torch.tensor([True, True, False, True, True, True])
    loss = optimize_model(torch.randn(BATCH_SIZE, 4), torch.randint(0, 2, (BATCH_SIZE, 1)), torch.randn(BATCH_SIZE),
                          torch.randn(int(mask.sum()), 4), mask)
    if i % 2 == 0:
        target_net.load_state_dict(policy_net.state_dict())
print(loss.item())
