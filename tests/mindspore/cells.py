"""Cells under test. In a source file on purpose: MindSpore graph mode parses source and cannot parse lambdas."""

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops


class XSinX(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        return (dout * (ops.sin(x) + x * ops.cos(x)),)


class MissingTerm(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        return (dout * ops.sin(x),)


class Float32Bprop(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        x32 = x.astype(ms.float32)
        return (dout.astype(ms.float32) * (ops.sin(x32) + x32 * ops.cos(x32)),)


class ExtraGrads(nn.Cell):
    def construct(self, x):
        return x * ops.sin(x)

    def bprop(self, x, out, dout):
        return (dout * (ops.sin(x) + x * ops.cos(x)), dout)


class ScaleWithBprop(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.array([2.0]), ms.float64), name="w")

    def construct(self, x):
        return x * self.w

    def bprop(self, x, out, dout):
        return (dout * self.w,)


class Flip(nn.Cell):
    def construct(self, x):
        return ops.flip(x, (1,))

    def bprop(self, x, out, dout):
        return (dout,)
