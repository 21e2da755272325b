# Reproduction of https://github.com/autogluon/autogluon/pull/1983 (AutoGluon multimodal's relational knowledge
# distillation loss, RKDLoss.pdist: asked in review why `res = res.clone()` is needed, the author removed it and got
# a runtime error: res[range(n), range(n)] = 0 zeroes the diagonal in place on the output of res.sqrt(), which
# SqrtBackward0 saved. RKDLoss as merged, with the clone line removed as in that test run; a small student/teacher
# distillation training step on random tensors stands in for the Lightning distiller module).
import torch
import torch.nn as nn
import torch.nn.functional as F
from typing import Optional

torch.manual_seed(0)


class RKDLoss(nn.Module):
    """
    Compute RKD Distance Loss.
    Paper Refer to: Relational Knowledge Disitllation, CVPR2019. https://arxiv.org/abs/1904.05068
    Code Refer to: https://github.com/HobbitLong/RepDistiller/blob/master/distiller_zoo/RKD.py
    """

    def __init__(self, distance_loss_weight: Optional[float] = 25.0, angle_loss_weight: Optional[float] = 50.0):
        super(RKDLoss, self).__init__()
        self.distance_loss_weight = distance_loss_weight
        self.angle_loss_weight = angle_loss_weight

    def forward(self, feature_student: Optional[torch.Tensor], feature_teacher: Optional[torch.Tensor]):
        # RKD loss
        with torch.no_grad():
            t_dist = self.pdist(feature_teacher, squared=False)
            mean_td = t_dist[t_dist > 0].mean()
            t_dist = t_dist / mean_td

        s_dist = self.pdist(feature_student, squared=False)
        mean_d = s_dist[s_dist > 0].mean()
        s_dist = s_dist / mean_d

        loss_distance = F.smooth_l1_loss(s_dist, t_dist)

        # RKD Angle loss
        with torch.no_grad():
            td = feature_teacher.unsqueeze(0) - feature_teacher.unsqueeze(1)
            norm_td = F.normalize(td, p=2, dim=2)
            t_angle = torch.bmm(norm_td, norm_td.transpose(1, 2)).view(-1)

        sd = feature_student.unsqueeze(0) - feature_student.unsqueeze(1)
        norm_sd = F.normalize(sd, p=2, dim=2)
        s_angle = torch.bmm(norm_sd, norm_sd.transpose(1, 2)).view(-1)

        loss_angle = F.smooth_l1_loss(s_angle, t_angle)

        loss = self.distance_loss_weight * loss_distance + self.angle_loss_weight * loss_angle

        return loss

    @staticmethod
    def pdist(embeddings: Optional[torch.Tensor], squared: Optional[bool] = False, eps: Optional[float] = 1e-12):
        e_square = embeddings.pow(2).sum(dim=1)
        prod = embeddings @ embeddings.t()
        res = (e_square.unsqueeze(1) + e_square.unsqueeze(0) - 2 * prod).clamp(min=eps)

        if not squared:
            res = res.sqrt()

        res = res.clone()
        res[range(len(embeddings)), range(len(embeddings))] = 0

        return res


class Net(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        features = self.encoder(x)
        return features, self.head(features)


teacher = Net(64).eval()
student = Net(16)
rkd_loss_func = RKDLoss()
hard_label_loss_func = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)

for step in range(3):
    x = torch.randn(12, 16)
    label = torch.randint(0, 3, (12,))
    with torch.no_grad():
        teacher_features, teacher_logits = teacher(x)
    student_features, student_logits = student(x)
    loss = hard_label_loss_func(student_logits, label)
    loss = loss + rkd_loss_func(student_features, teacher_features)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.4f}")
