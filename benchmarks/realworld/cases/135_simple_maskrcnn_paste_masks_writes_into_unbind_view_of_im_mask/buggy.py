# Reproduction of https://github.com/Okery/PyTorch-Simple-MaskRCNN/issues/15 (PyTorch-Simple-MaskRCNN: the reporter
# runs the model in eval mode without torch.no_grad(); Transformer.postprocess pastes each predicted mask into the
# image with `for m, b, im in zip(mask, box, im_mask): ... im[y1:y2, x1:x2] = m[...]`, and im, one of the views that
# iterating im_mask (unbind) returns, is written in place with a mask that requires grad. The repository's demo runs
# inference under torch.no_grad(). ResNet-FPN backbone, RPN and RoIAlign replaced by a small conv backbone and fixed-
# count heads; a random 3x256x256 image as in the report; CPU).
import math

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)


class Transformer:
    def __init__(self, min_size, max_size, image_mean, image_std):
        self.min_size = min_size
        self.max_size = max_size
        self.image_mean = image_mean
        self.image_std = image_std

    def __call__(self, image, target):
        image = self.normalize(image)
        image, target = self.resize(image, target)
        image = self.batched_image(image)

        return image, target

    def normalize(self, image):
        if image.shape[0] == 1:
            image = image.repeat(3, 1, 1)

        dtype, device = image.dtype, image.device
        mean = torch.tensor(self.image_mean, dtype=dtype, device=device)
        std = torch.tensor(self.image_std, dtype=dtype, device=device)
        return (image - mean[:, None, None]) / std[:, None, None]

    def resize(self, image, target):
        ori_image_shape = image.shape[-2:]
        min_size = float(min(image.shape[-2:]))
        max_size = float(max(image.shape[-2:]))

        scale_factor = min(self.min_size / min_size, self.max_size / max_size)
        size = [round(s * scale_factor) for s in ori_image_shape]
        image = F.interpolate(image[None], size=size, mode='bilinear', align_corners=False)[0]

        return image, target

    def batched_image(self, image, stride=32):
        size = image.shape[-2:]
        max_size = tuple(math.ceil(s / stride) * stride for s in size)

        batch_shape = (image.shape[-3],) + max_size
        batched_img = image.new_full(batch_shape, 0)
        batched_img[:, :image.shape[-2], :image.shape[-1]] = image

        return batched_img[None]

    def postprocess(self, result, image_shape, ori_image_shape):
        box = result['boxes']
        box[:, [0, 2]] = box[:, [0, 2]] * ori_image_shape[1] / image_shape[1]
        box[:, [1, 3]] = box[:, [1, 3]] * ori_image_shape[0] / image_shape[0]
        result['boxes'] = box

        if 'masks' in result:
            mask = result['masks']
            mask = paste_masks_in_image(mask, box, 1, ori_image_shape)
            result['masks'] = mask

        return result


def expand_detection(mask, box, padding):
    M = mask.shape[-1]
    scale = (M + 2 * padding) / M
    padded_mask = torch.nn.functional.pad(mask, (padding,) * 4)

    w_half = (box[:, 2] - box[:, 0]) * 0.5
    h_half = (box[:, 3] - box[:, 1]) * 0.5
    x_c = (box[:, 2] + box[:, 0]) * 0.5
    y_c = (box[:, 3] + box[:, 1]) * 0.5

    w_half = w_half * scale
    h_half = h_half * scale

    box_exp = torch.zeros_like(box)
    box_exp[:, 0] = x_c - w_half
    box_exp[:, 2] = x_c + w_half
    box_exp[:, 1] = y_c - h_half
    box_exp[:, 3] = y_c + h_half
    return padded_mask, box_exp.to(torch.int64)


def paste_masks_in_image(mask, box, padding, image_shape):
    mask, box = expand_detection(mask, box, padding)

    N = mask.shape[0]
    size = (N,) + tuple(image_shape)
    im_mask = torch.zeros(size, dtype=mask.dtype, device=mask.device)
    for m, b, im in zip(mask, box, im_mask):
        b = b.tolist()
        w = max(b[2] - b[0], 1)
        h = max(b[3] - b[1], 1)

        m = F.interpolate(m[None, None], size=(h, w), mode='bilinear', align_corners=False)[0][0]

        x1 = max(b[0], 0)
        y1 = max(b[1], 0)
        x2 = min(b[2], image_shape[1])
        y2 = min(b[3], image_shape[0])

        im[y1:y2, x1:x2] = m[(y1 - b[1]):(y2 - b[1]), (x1 - b[0]):(x2 - b[0])]
    return im_mask


class RoIHeads(nn.Module):
    """Stand-in for the box and mask heads: a fixed number of detections, boxes regressed from pooled features."""

    def __init__(self, out_channels, num_classes, num_detections=3):
        super().__init__()
        self.num_detections = num_detections
        self.box_predictor = nn.Linear(out_channels, num_detections * 4)
        self.mask_predictor = nn.Sequential(
            nn.Conv2d(out_channels, out_channels, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, num_classes, 1, 1, 0))

    def forward(self, feature, image_shape):
        pooled = F.adaptive_avg_pool2d(feature, 1).flatten(1)
        rel = torch.sigmoid(self.box_predictor(pooled)).view(self.num_detections, 4)
        x0, y0 = rel[:, 0] * 0.5, rel[:, 1] * 0.5
        x1, y1 = x0 + 0.2 + rel[:, 2] * 0.3, y0 + 0.2 + rel[:, 3] * 0.3
        boxes = torch.stack([x0 * image_shape[1], y0 * image_shape[0], x1 * image_shape[1], y1 * image_shape[0]], 1)
        mask_logits = self.mask_predictor(F.adaptive_avg_pool2d(feature, 14))
        masks = torch.sigmoid(mask_logits[0, 1:1 + 1]).expand(self.num_detections, 14, 14)
        labels = torch.ones(self.num_detections, dtype=torch.int64)
        return dict(boxes=boxes, labels=labels, scores=rel.mean(1), masks=masks)


class MaskRCNN(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        out_channels = 16
        self.backbone = nn.Sequential(nn.Conv2d(3, out_channels, 3, 2, 1), nn.ReLU(inplace=True),
                                      nn.Conv2d(out_channels, out_channels, 3, 2, 1), nn.ReLU(inplace=True))
        self.head = RoIHeads(out_channels, num_classes)
        self.transformer = Transformer(
            min_size=128, max_size=224,
            image_mean=[0.485, 0.456, 0.406],
            image_std=[0.229, 0.224, 0.225])

    def forward(self, image, target=None):
        ori_image_shape = image.shape[-2:]

        image, target = self.transformer(image, target)
        image_shape = image.shape[-2:]
        feature = self.backbone(image)

        result = self.head(feature, image_shape)

        result = self.transformer.postprocess(result, image_shape, ori_image_shape)
        return result


model = MaskRCNN(3)
model.eval()

img = torch.rand(size=[3, 256, 256])
p = model(img)
print(p['boxes'].shape, p['masks'].shape, p['masks'].sum().item())
