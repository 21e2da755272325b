# Reproduction of https://github.com/jacobgil/pytorch-grad-cam/pull/183 (pytorch-grad-cam before that pull request:
# ActivationsAndGradients records the target layer's gradient with register_full_backward_hook, which hands the
# layer's output on as a view made by the hook's custom Function; the next module, ReLU(inplace=True), writes that
# view in place and the forward fails ("Output 0 of BackwardHookFunctionBackward is a view and is being modified
# inplace"). The pull request records the gradient with a forward hook that registers a tensor hook on the output.
# The library's ActivationsAndGradients as it was, BaseCAM/GradCAM shrunk to the gradient-weighted CAM (no cv2,
# no ttach), on a small VGG-style model whose target conv is followed by an in-place ReLU; 32x32 inputs).
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)


class ActivationsAndGradients:
    """ Class for extracting activations and
    registering gradients from targetted intermediate layers """

    def __init__(self, model, target_layers, reshape_transform):
        self.model = model
        self.gradients = []
        self.activations = []
        self.reshape_transform = reshape_transform
        self.handles = []
        for target_layer in target_layers:
            self.handles.append(
                target_layer.register_forward_hook(
                    self.save_activation))
            # Backward compitability with older pytorch versions:
            if hasattr(target_layer, 'register_full_backward_hook'):
                self.handles.append(
                    target_layer.register_full_backward_hook(
                        self.save_gradient))
            else:
                self.handles.append(
                    target_layer.register_backward_hook(
                        self.save_gradient))

    def save_activation(self, module, input, output):
        activation = output
        if self.reshape_transform is not None:
            activation = self.reshape_transform(activation)
        self.activations.append(activation.cpu().detach())

    def save_gradient(self, module, grad_input, grad_output):
        # Gradients are computed in reverse order
        grad = grad_output[0]
        if self.reshape_transform is not None:
            grad = self.reshape_transform(grad)
        self.gradients = [grad.cpu().detach()] + self.gradients

    def __call__(self, x):
        self.gradients = []
        self.activations = []
        return self.model(x)

    def release(self):
        for handle in self.handles:
            handle.remove()


class GradCAM:
    def __init__(self, model, target_layers, reshape_transform=None):
        self.model = model.eval()
        self.target_layers = target_layers
        self.reshape_transform = reshape_transform
        self.activations_and_grads = ActivationsAndGradients(
            self.model, target_layers, reshape_transform)

    def get_cam_weights(self, grads):
        return np.mean(grads, axis=(2, 3))

    def get_loss(self, output, target_category):
        loss = 0
        for i in range(len(target_category)):
            loss = loss + output[i, target_category[i]]
        return loss

    def __call__(self, input_tensor, target_category=None):
        output = self.activations_and_grads(input_tensor)
        if target_category is None:
            target_category = np.argmax(output.cpu().data.numpy(), axis=-1)

        self.model.zero_grad()
        loss = self.get_loss(output, target_category)
        loss.backward(retain_graph=True)

        activations = self.activations_and_grads.activations[0].numpy()
        grads = self.activations_and_grads.gradients[0].numpy()
        weights = self.get_cam_weights(grads)
        cam = (weights[:, :, None, None] * activations).sum(axis=1)
        cam = np.maximum(cam, 0)
        return cam


class VGGLike(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(8, 16, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((2, 2))
        self.classifier = nn.Linear(16 * 2 * 2, num_classes)

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


model = VGGLike()
target_layers = [model.features[3]]
cam = GradCAM(model=model, target_layers=target_layers)
input_tensor = torch.randn(2, 3, 32, 32)
grayscale_cam = cam(input_tensor=input_tensor)
print(grayscale_cam.shape, float(grayscale_cam.max()))
