# DataLoader(num_workers=2) whose collate returns a class defined in the script: it hung forever under
# `gradguard run` (the workers could not unpickle the class).
import torch
from torch.utils.data import DataLoader, Dataset


class Batch:
    def __init__(self, x):
        self.x = x


def collate(items):
    return Batch(torch.stack(items))


class Numbers(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((2,), float(i))


if __name__ == "__main__":
    torch.manual_seed(0)
    w = torch.ones(2, requires_grad=True)
    for batch in DataLoader(Numbers(), batch_size=4, num_workers=2, collate_fn=collate,
                            multiprocessing_context="spawn"):
        (batch.x * w).sum().backward()
    print("grad", w.grad.tolist())
