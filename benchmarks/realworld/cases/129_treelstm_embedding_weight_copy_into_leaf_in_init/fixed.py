# Reproduction of https://github.com/dasguptar/treelstm.pytorch/pull/26 (treelstm/model.py when the port to PyTorch
# 0.4 removed every `.data`: SimilarityTreeLSTM.__init__ copies the GloVe vectors into the embedding with
# self.emb.weight.copy_(init_emb), a leaf that requires grad when the embedding is not frozen. Two tiny trees and
# random vectors stand in for SICK and GloVe; F.sigmoid/F.tanh written torch.sigmoid/torch.tanh).
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable as Var

torch.manual_seed(0)
PAD = 0


class Tree(object):
    def __init__(self, idx, children=()):
        self.idx = idx
        self.children = list(children)
        self.num_children = len(self.children)


# module for childsumtreelstm
class ChildSumTreeLSTM(nn.Module):
    def __init__(self, in_dim, mem_dim):
        super(ChildSumTreeLSTM, self).__init__()
        self.in_dim = in_dim
        self.mem_dim = mem_dim
        self.ioux = nn.Linear(self.in_dim, 3 * self.mem_dim)
        self.iouh = nn.Linear(self.mem_dim, 3 * self.mem_dim)
        self.fx = nn.Linear(self.in_dim, self.mem_dim)
        self.fh = nn.Linear(self.mem_dim, self.mem_dim)

    def node_forward(self, inputs, child_c, child_h):
        child_h_sum = torch.sum(child_h, dim=0, keepdim=True)

        iou = self.ioux(inputs) + self.iouh(child_h_sum)
        i, o, u = torch.split(iou, iou.size(1) // 3, dim=1)
        i, o, u = torch.sigmoid(i), torch.sigmoid(o), torch.tanh(u)

        f = torch.sigmoid(
            self.fh(child_h) +
            self.fx(inputs).repeat(len(child_h), 1)
        )
        fc = torch.mul(f, child_c)

        c = torch.mul(i, u) + torch.sum(fc, dim=0, keepdim=True)
        h = torch.mul(o, torch.tanh(c))
        return c, h

    def forward(self, tree, inputs):
        for idx in range(tree.num_children):
            self.forward(tree.children[idx], inputs)

        if tree.num_children == 0:
            child_c = Var(inputs[0].data.new(1, self.mem_dim).fill_(0.))
            child_h = Var(inputs[0].data.new(1, self.mem_dim).fill_(0.))
        else:
            child_c, child_h = zip(* map(lambda x: x.state, tree.children))
            child_c, child_h = torch.cat(child_c, dim=0), torch.cat(child_h, dim=0)

        tree.state = self.node_forward(inputs[tree.idx].unsqueeze(0), child_c, child_h)
        return tree.state


# module for distance-angle similarity
class Similarity(nn.Module):
    def __init__(self, mem_dim, hidden_dim, num_classes):
        super(Similarity, self).__init__()
        self.mem_dim = mem_dim
        self.hidden_dim = hidden_dim
        self.num_classes = num_classes
        self.wh = nn.Linear(2 * self.mem_dim, self.hidden_dim)
        self.wp = nn.Linear(self.hidden_dim, self.num_classes)

    def forward(self, lvec, rvec):
        mult_dist = torch.mul(lvec, rvec)
        abs_dist = torch.abs(torch.add(lvec, -rvec))
        vec_dist = torch.cat((mult_dist, abs_dist), 1)

        out = torch.sigmoid(self.wh(vec_dist))
        out = F.log_softmax(self.wp(out), dim=1)
        return out


# putting the whole model together
class SimilarityTreeLSTM(nn.Module):
    def __init__(self, vocab_size, in_dim, mem_dim, hidden_dim, num_classes, sparsity, freeze, init_emb):
        super(SimilarityTreeLSTM, self).__init__()
        self.emb = nn.Embedding(vocab_size, in_dim, padding_idx=PAD, sparse=sparsity)
        self.emb.weight.data.copy_(init_emb)
        if freeze:
            self.emb.weight.requires_grad = False
        self.childsumtreelstm = ChildSumTreeLSTM(in_dim, mem_dim)
        self.similarity = Similarity(mem_dim, hidden_dim, num_classes)

    def forward(self, ltree, linputs, rtree, rinputs):
        linputs = self.emb(linputs)
        rinputs = self.emb(rinputs)
        lstate, lhidden = self.childsumtreelstm(ltree, linputs)
        rstate, rhidden = self.childsumtreelstm(rtree, rinputs)
        output = self.similarity(lstate, rstate)
        return output


# main.py: load the embeddings, build the model (the embedding is trained: --freeze_embed not given)
vocab_size, input_dim, mem_dim, hidden_dim, num_classes = 12, 6, 8, 10, 5
emb = torch.randn(vocab_size, input_dim)
emb[PAD].zero_()
model = SimilarityTreeLSTM(vocab_size, input_dim, mem_dim, hidden_dim, num_classes, False, False,
                           emb)
optimizer = torch.optim.Adagrad(model.parameters(), lr=0.01)

ltree = Tree(2, [Tree(0), Tree(1)])
rtree = Tree(1, [Tree(0)])
linput, rinput = torch.tensor([3, 5, 7]), torch.tensor([4, 9])
target = torch.softmax(torch.randn(1, num_classes), dim=1)

optimizer.zero_grad()
output = model(ltree, linput, rtree, rinput)
loss = F.kl_div(output, target, reduction='batchmean')
loss.backward()
optimizer.step()
print(loss.item())
