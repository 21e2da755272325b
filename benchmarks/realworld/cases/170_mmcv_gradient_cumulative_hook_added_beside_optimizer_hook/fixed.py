# Reproduction of https://github.com/open-mmlab/mmcv/issues/1379 (mmcv 1.3.14: a user enabled gradient accumulation
# by adding GradientCumulativeOptimizerHook to custom_hooks of an mmdetection config; the base schedule's
# optimizer_config still registers the default OptimizerHook, so after each iteration both hooks call backward() on
# runner.outputs['loss'] and the second fails with "Trying to backward through the graph a second time". The
# maintainer's fix: set the cumulative hook as optimizer_config instead. mmcv's runner, hook registry and the two
# optimizer hooks shrunk to what the train loop uses; a tiny detector-like model with train_step on random tensors).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)

PRIORITY = {'VERY_HIGH': 10, 'HIGH': 30, 'ABOVE_NORMAL': 40, 'NORMAL': 50, 'LOW': 70}
HOOKS = {}


def register_module(cls):
    HOOKS[cls.__name__] = cls
    return cls


def build_from_cfg(cfg, registry):
    args = dict(cfg)
    obj_type = args.pop('type')
    return registry[obj_type](**args)


class Hook:

    def before_train_iter(self, runner):
        pass

    def after_train_iter(self, runner):
        pass

    def every_n_iters(self, runner, n):
        return (runner.iter + 1) % n == 0 if n > 0 else False

    def is_last_iter(self, runner):
        return runner.iter + 1 == runner._max_iters


@register_module
class OptimizerHook(Hook):

    def __init__(self, grad_clip=None):
        self.grad_clip = grad_clip

    def after_train_iter(self, runner):
        runner.optimizer.zero_grad()
        runner.outputs['loss'].backward()
        runner.optimizer.step()


@register_module
class GradientCumulativeOptimizerHook(OptimizerHook):

    def __init__(self, cumulative_iters=1, **kwargs):
        super(GradientCumulativeOptimizerHook, self).__init__(**kwargs)
        self.cumulative_iters = cumulative_iters
        self.divisible_iters = 0
        self.remainder_iters = 0
        self.initialized = False

    def _init(self, runner):
        residual_iters = runner.max_iters - runner.iter
        self.divisible_iters = (
            residual_iters // self.cumulative_iters * self.cumulative_iters)
        self.remainder_iters = residual_iters - self.divisible_iters
        self.initialized = True

    def after_train_iter(self, runner):
        if not self.initialized:
            self._init(runner)

        if runner.iter < self.divisible_iters:
            loss_factor = self.cumulative_iters
        else:
            loss_factor = self.remainder_iters
        loss = runner.outputs['loss']
        loss = loss / loss_factor
        loss.backward()

        if (self.every_n_iters(runner, self.cumulative_iters)
                or self.is_last_iter(runner)):
            runner.optimizer.step()
            runner.optimizer.zero_grad()


class EpochBasedRunner:

    def __init__(self, model, optimizer, max_epochs):
        self.model = model
        self.optimizer = optimizer
        self._hooks = []
        self._max_epochs = max_epochs
        self._max_iters = None
        self._epoch = 0
        self._iter = 0
        self._inner_iter = 0
        self.outputs = {}

    @property
    def iter(self):
        return self._iter

    @property
    def max_iters(self):
        return self._max_iters

    def register_hook(self, hook, priority='NORMAL'):
        priority = PRIORITY[priority]
        hook.priority = priority
        inserted = False
        for i in range(len(self._hooks) - 1, -1, -1):
            if priority >= self._hooks[i].priority:
                self._hooks.insert(i + 1, hook)
                inserted = True
                break
        if not inserted:
            self._hooks.insert(0, hook)

    def register_optimizer_hook(self, optimizer_config):
        if optimizer_config is None:
            return
        optimizer_config.setdefault('type', 'OptimizerHook')
        hook = build_from_cfg(optimizer_config, HOOKS)
        self.register_hook(hook, priority='ABOVE_NORMAL')

    def register_custom_hooks(self, custom_config):
        for item in custom_config:
            item = item.copy()
            priority = item.pop('priority', 'NORMAL')
            self.register_hook(build_from_cfg(item, HOOKS), priority=priority)

    def register_training_hooks(self, optimizer_config=None, custom_hooks_config=None):
        self.register_optimizer_hook(optimizer_config)
        self.register_custom_hooks(custom_hooks_config or [])

    def call_hook(self, fn_name):
        for hook in self._hooks:
            getattr(hook, fn_name)(self)

    def run_iter(self, data_batch, train_mode, **kwargs):
        outputs = self.model.train_step(data_batch, self.optimizer, **kwargs)
        self.outputs = outputs

    def train(self, data_loader, **kwargs):
        self.model.train()
        self.data_loader = data_loader
        self._max_iters = self._max_epochs * len(self.data_loader)
        for i, data_batch in enumerate(self.data_loader):
            self._inner_iter = i
            self.call_hook('before_train_iter')
            self.run_iter(data_batch, train_mode=True, **kwargs)
            self.call_hook('after_train_iter')
            self._iter += 1
        self._epoch += 1

    def run(self, data_loaders, max_epochs):
        while self._epoch < max_epochs:
            self.train(data_loaders[0])


class TinyDetector(nn.Module):

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.cls_head = nn.Linear(8, 4)

    def forward(self, img, gt_labels):
        feat = self.backbone(img).flatten(1)
        return dict(loss_cls=F.cross_entropy(self.cls_head(feat), gt_labels))

    def _parse_losses(self, losses):
        loss = sum(_value for _key, _value in losses.items() if 'loss' in _key)
        return loss, {k: v.item() for k, v in losses.items()}

    def train_step(self, data, optimizer):
        losses = self(**data)
        loss, log_vars = self._parse_losses(losses)
        return dict(loss=loss, log_vars=log_vars, num_samples=len(data['img']))


# config (configs/_base_/schedules/schedule_1x.py + the user's addition)
optimizer_config = dict(type="GradientCumulativeOptimizerHook", cumulative_iters=4)
custom_hooks = []

model = TinyDetector()
optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
data_loader = [dict(img=torch.randn(2, 3, 16, 16), gt_labels=torch.randint(0, 4, (2,))) for _ in range(8)]

runner = EpochBasedRunner(model, optimizer, max_epochs=1)
runner.register_training_hooks(optimizer_config, custom_hooks_config=custom_hooks)
runner.run([data_loader], max_epochs=1)
print('done')
