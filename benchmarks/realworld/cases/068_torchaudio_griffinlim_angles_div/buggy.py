# Reproduction of https://github.com/pytorch/audio/issues/729 (torchaudio.functional.griffinlim before
# pytorch/audio#730, with its complex_norm helper; driven by the minimal example, shrunk).
import math
import torch

torch.manual_seed(0)


def complex_norm(complex_tensor, power=1.0):
    return complex_tensor.pow(2.).sum(-1).pow(0.5 * power)


def griffinlim(specgram, window, n_fft, hop_length, win_length, power, n_iter, momentum, length, rand_init):
    assert momentum < 1, 'momentum=%s > 1 can be unstable' % momentum
    assert momentum > 0, 'momentum=%s < 0' % momentum

    shape = specgram.size()
    specgram = specgram.reshape([-1] + list(shape[-2:]))
    specgram = specgram.pow(1 / power)

    # randomly initialize the phase
    batch, freq, frames = specgram.size()
    if rand_init:
        angles = 2 * math.pi * torch.rand(batch, freq, frames)
    else:
        angles = torch.zeros(batch, freq, frames)
    angles = torch.stack([angles.cos(), angles.sin()], dim=-1).to(dtype=specgram.dtype)
    specgram = specgram.unsqueeze(-1).expand_as(angles)

    # And initialize the previous iterate to 0
    rebuilt = torch.tensor(0.)

    for _ in range(n_iter):
        # Store the previous iterate
        tprev = rebuilt

        # Invert with our current estimate of the phases
        inverse = torch.istft(torch.view_as_complex(specgram * angles), n_fft=n_fft, hop_length=hop_length,
                              win_length=win_length, window=window, length=length)

        # Rebuild the spectrogram
        rebuilt = torch.view_as_real(torch.stft(inverse, n_fft=n_fft, hop_length=hop_length, win_length=win_length,
                                                window=window, center=True, pad_mode='reflect', normalized=False,
                                                onesided=True, return_complex=True))

        # Update our phase estimates
        angles = rebuilt.sub(tprev, alpha=momentum / (1 + momentum))
        angles = angles.div_(complex_norm(angles).add_(1e-16).unsqueeze(-1).expand_as(angles))

    # Return the final phase estimates
    waveform = torch.istft(torch.view_as_complex(specgram * angles), n_fft=n_fft, hop_length=hop_length,
                           win_length=win_length, window=window, length=length)
    return waveform.reshape(shape[:-2] + waveform.shape[-1:])


n_fft, hop_length, win_length = 64, 16, 32
window = torch.hann_window(win_length)
x = torch.rand(1, 800)
spec = torch.view_as_real(torch.stft(x, n_fft=n_fft, hop_length=hop_length, win_length=win_length, window=window,
                                     return_complex=True))
mag = spec.pow(2).sum(-1).transpose(1, -1)
model = torch.nn.Linear(n_fft // 2 + 1, n_fft // 2 + 1)
out = model(mag).transpose(1, -1)
wav = griffinlim(out, window, n_fft, hop_length, win_length, power=2.0, n_iter=4, momentum=0.99,
                 length=x.shape[-1], rand_init=True)
optimizer = torch.optim.Adam(model.parameters(), lr=0.0001)
loss = torch.nn.functional.mse_loss(wav, x)
loss.backward()
optimizer.step()
print(loss.item())
