# Reproduction of https://github.com/linkedin/Liger-Kernel/issues/254 ("Are you even allowed to do these ops
# inplace?"): LigerSiLUMulFunction's backward kernel (src/liger_kernel/ops/swiglu.py) stores da and db into the
# buffers of its saved inputs a and b and returns them as the gradients. When an input was also saved by another
# function, as in the example (a custom Exponential that saves its output x_exp, then swiglu(x_exp, x_exp)),
# that function's backward silently reads gradients instead of exp(x): no error, wrong x.grad. The maintainers kept
# the in-place kernel ("fairly uncommon in an LLM training loop"). The Triton kernels are written in torch; their
# tl.store through raw pointers is modelled by .data.copy_, which autograd's version counter does not see either.
# The Exponential is made runnable (@staticmethod, saved tensor unpacked); random data, MSE loss).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def silu(x):
    return x * torch.sigmoid(x)


def ensure_contiguous(fn):
    def wrapper(ctx, *args, **kwargs):
        args = [arg.contiguous() if isinstance(arg, torch.Tensor) else arg for arg in args]
        return fn(ctx, *args, **kwargs)

    return wrapper


def _swiglu_forward_kernel(a, b, c):
    # sigmoid requires type float32
    a_row = a.to(torch.float32)
    b_row = b
    c_row = silu(a_row) * b_row
    c.copy_(c_row)


def _swiglu_backward_kernel(dc, a, b):
    dc_row = dc
    # sigmoid requires type float32
    a_row = a.to(torch.float32)
    b_row = b

    # recomputation to save memory
    sig_a = torch.sigmoid(a_row)
    silu_a = a_row * sig_a
    db_row = dc_row * silu_a
    da_row = dc_row * (silu_a * (1 - sig_a) + sig_a) * b_row

    a.data.copy_(da_row)  # tl.store(a_ptr + col_offsets, da_row, mask=mask)
    b.data.copy_(db_row)  # tl.store(b_ptr + col_offsets, db_row, mask=mask)


def swiglu_forward(a, b):
    ori_shape = a.shape

    n_cols = ori_shape[-1]
    a = a.view(-1, n_cols)
    b = b.view(-1, n_cols)
    c = torch.empty_like(a)
    _swiglu_forward_kernel(a, b, c)
    return a, b, c.view(*ori_shape)


def swiglu_backward(a, b, dc):
    ori_shape = dc.shape
    n_cols = ori_shape[-1]
    dc = dc.view(-1, n_cols)
    _swiglu_backward_kernel(dc, a, b)
    return a.view(*ori_shape), b.view(*ori_shape)


class LigerSiLUMulFunction(torch.autograd.Function):
    @staticmethod
    @ensure_contiguous
    def forward(ctx, a, b):
        a, b, c = swiglu_forward(a, b)
        ctx.save_for_backward(a, b)
        return c

    @staticmethod
    @ensure_contiguous
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        a, b = swiglu_backward(a, b, dc)
        return a, b


swiglu = LigerSiLUMulFunction.apply


class Exponential(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = torch.exp(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, out_grad):
        out, = ctx.saved_tensors
        x_grad = out_grad * out
        return x_grad


x = torch.randn(4, 16, requires_grad=True)
target = torch.randn(4, 16)
x_exp = Exponential.apply(x)
y = swiglu(x_exp, x_exp)
loss = F.mse_loss(y, target)
loss.backward()
print(loss.item(), x.grad.norm().item())
