# Framework-free on purpose: tests/paddle and tests/mindspore run in venvs without torch.
