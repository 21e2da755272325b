# Reproduction of https://github.com/paarthneekhara/AdversarialDeepFakes/issues/23 (attack_algos.robust_fgsm ->
# predict_with_model -> norm_transform: the repo's dataset/transform.py Normalize runs t.sub_(m).div_(s) over the
# channels of a tensor that requires grad (the attacked image); iterating a tensor unbinds it, and the outputs of unbind
# may not be modified in place. XceptionNet shrunk to a small conv net, the transform list to the identity).
import torch
import torch.nn as nn
from torch import autograd

torch.manual_seed(0)


class Normalize(object):
    def __init__(self, mean, std):
        self.mean = mean
        self.std = std

    def __call__(self, tensor):
        return torch.stack([t.sub(m).div(s) for t, m, s in zip(tensor, self.mean, self.std)])


xception_default_data_transforms = {
    'normalize': Normalize([0.5] * 3, [0.5] * 3),
}


def predict_with_model(preprocessed_image, model, model_type, post_function=nn.Softmax(dim=1), cuda=False):
    # differentiable resizing: doing resizing here instead of preprocessing
    if model_type == "xception":
        resized_image = nn.functional.interpolate(preprocessed_image, size=(29, 29), mode="bilinear", align_corners=True)
        norm_transform = xception_default_data_transforms['normalize']

    normalized_image = norm_transform(resized_image)

    logits = model(normalized_image)
    output = post_function(logits)

    _, prediction = torch.max(output, 1)  # argmax
    prediction = float(prediction.cpu().numpy()[0])
    return int(prediction), output, logits


def robust_fgsm(input_img, model, model_type, cuda=False, max_iter=3, alpha=1/255.0, eps=16/255.0, desired_acc=0.95):
    input_var = autograd.Variable(input_img, requires_grad=True)
    iter_no = 0
    while iter_no < max_iter:
        transform_functions = [lambda x: x]
        loss = 0
        all_fooled = True
        for transform_fn in transform_functions:
            transformed_img = transform_fn(input_var)
            prediction, output, logits = predict_with_model(transformed_img, model, model_type, cuda=cuda)
            if output[0][0] < desired_acc:
                all_fooled = False
            loss += torch.clamp(logits[0][1] - logits[0][0] + 10, min=0.0)
        if all_fooled:
            break
        loss /= (1. * len(transform_functions))
        if input_var.grad is not None:
            input_var.grad.data.zero_()  # just to ensure nothing funny happens
        loss.backward()

        step_adv = input_var.detach() - alpha * torch.sign(input_var.grad.detach())
        total_pert = torch.clamp(step_adv - input_img, -eps, eps)
        input_adv = torch.clamp(input_img + total_pert, 0, 1)
        input_var.data = input_adv.detach()
        iter_no += 1
    return input_var, {'attack_iterations': iter_no}


model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
processed_image = torch.rand(1, 3, 32, 32)
perturbed_image, attack_meta_data = robust_fgsm(processed_image, model, "xception")
print(attack_meta_data)
