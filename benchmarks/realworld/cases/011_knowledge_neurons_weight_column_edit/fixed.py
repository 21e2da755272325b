# Reproduction of https://github.com/Hunter-DDM/knowledge-neurons/issues/14 (6_edit_knowledge_sampled.py, lines 313-315).
import torch
from torch import nn

torch.manual_seed(0)


class Output(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(16, 8)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.output = Output()


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([Layer() for _ in range(2)])


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = Bert()


model = Model()
ori_pred_emb = torch.randn(8)
tgt_emb = torch.randn(8)
lambda_list_1, lambda_list_2 = [0.5, 0.5], [0.5, 0.5]
with torch.no_grad():
    for i, (layer, pos) in enumerate([(0, 3), (1, 7)]):
        model.bert.encoder.layer[layer].output.dense.weight[:, pos] -= ori_pred_emb * lambda_list_1[i]
        model.bert.encoder.layer[layer].output.dense.weight[:, pos] += tgt_emb * lambda_list_2[i]
print(model.bert.encoder.layer[0].output.dense.weight.sum())
