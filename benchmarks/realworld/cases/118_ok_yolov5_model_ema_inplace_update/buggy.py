# Correct program, from https://github.com/ultralytics/yolov5/blob/master/utils/torch_utils.py (ModelEMA: after each
# optimizer step the EMA copy's state_dict tensors are decayed and accumulated in place, v *= d; v += (1 - d) *
# msd[k].detach(); the EMA parameters never require grad and the EMA model only runs under no_grad for validation.
# The YOLOv5 model shrunk to a conv/BN/SiLU stack with a 1x1 head; the data loader to random images).
import math
from copy import deepcopy

import torch
import torch.nn as nn

torch.manual_seed(0)


def is_parallel(model):
    # Returns True if model is of type DP or DDP
    return type(model) in (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel)


def de_parallel(model):
    # De-parallelize a model: returns single-GPU model if model is of type DP or DDP
    return model.module if is_parallel(model) else model


class ModelEMA:
    """ Updated Exponential Moving Average (EMA) from https://github.com/rwightman/pytorch-image-models
    Keeps a moving average of everything in the model state_dict (parameters and buffers)
    For EMA details see https://www.tensorflow.org/api_docs/python/tf/train/ExponentialMovingAverage
    """

    def __init__(self, model, decay=0.9999, tau=2000, updates=0):
        # Create EMA
        self.ema = deepcopy(de_parallel(model)).eval()  # FP32 EMA
        self.updates = updates  # number of EMA updates
        self.decay = lambda x: decay * (1 - math.exp(-x / tau))  # decay exponential ramp (to help early epochs)
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model):
        # Update EMA parameters
        self.updates += 1
        d = self.decay(self.updates)

        msd = de_parallel(model).state_dict()  # model state_dict
        for k, v in self.ema.state_dict().items():
            if v.dtype.is_floating_point:  # true for FP16 and FP32
                v *= d
                v += (1 - d) * msd[k].detach()


model = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.SiLU(),
                      nn.Conv2d(8, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.SiLU(),
                      nn.Conv2d(8, 3 * 6, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
ema = ModelEMA(model)
for i in range(3):
    imgs, targets = torch.rand(2, 3, 32, 32), torch.rand(2, 3 * 6, 8, 8)
    pred = model(imgs)  # forward
    loss = nn.functional.mse_loss(pred.sigmoid(), targets)
    loss.backward()  # backward
    optimizer.step()  # optimize
    optimizer.zero_grad()
    if ema:
        ema.update(model)
with torch.no_grad():
    val_pred = ema.ema(torch.rand(2, 3, 32, 32))
print(loss.item(), val_pred.shape)
