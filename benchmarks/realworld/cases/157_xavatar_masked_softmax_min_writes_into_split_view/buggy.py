# Reproduction of https://github.com/Skype-line/X-Avatar/issues/12 (training X-Avatar's RGB-D SDF model fails with
# "Output 0 of ReshapeAliasBackward0 is a view and is being modified inplace. This view is the output of a function
# that returns multiple views": XAVATARModel.forward splits the shape-network output with torch.split, reshapes each
# piece and hands it to masked_softmax, whose 'min' mode (used for SDF in eval_mode, which training_step sets) writes
# vec[~mask.bool()] = 1 into that view. lib/model/helpers.py and the forward/training_step as released; the
# ImplicitNetwork, the root-finding ForwardDeformer and the data are shrunk to small stand-ins with the same shapes
# (candidate canonical points per deformed point and a valid_ids mask); CPU, a few Adam steps).
import torch
import torch.nn as nn

torch.manual_seed(0)


def masked_softmax(vec, mask, dim=-1, mode='softmax', soft_blend=1):
    if mode == 'softmax':
        vec = torch.distributions.Bernoulli(logits=vec).probs

        masked_exps = torch.exp(soft_blend*vec) * mask.float()
        masked_exps_sum = masked_exps.sum(dim)

        output = torch.zeros_like(vec)
        output[masked_exps_sum>0,:] = masked_exps[masked_exps_sum>0,:]/ masked_exps_sum[masked_exps_sum>0].unsqueeze(-1)

        output = (output * vec).sum(dim, keepdim=True)

        value = torch.distributions.Bernoulli(probs=output).logits
        index = None
    elif mode == 'max':
        vec[~mask.bool()] = -100
        value, index = torch.max(vec, dim, keepdim=True)
    elif mode == 'min':
        vec[~mask.bool()] = 1
        value, index = torch.min(vec, dim, keepdim=True)
    else:
        raise NotImplementedError
    return value, index


class ImplicitNetwork(nn.Module):  # stand-in for lib/model/network.py: MLP on points + pose condition
    def __init__(self, d_in=3, d_out=1, width=32, cond_dim=8):
        super().__init__()
        self.lin0 = nn.Linear(d_in + cond_dim, width)
        self.lin1 = nn.Linear(width, width)
        self.lin2 = nn.Linear(width, d_out)
        self.act = nn.Softplus(beta=100)

    def forward(self, input, cond, return_feature=False):
        n_batch, n_point, _ = input.shape
        cond = cond.unsqueeze(1).expand(n_batch, n_point, cond.shape[-1])
        x = torch.cat([input, cond], dim=-1)
        x = self.act(self.lin0(x))
        x = self.act(self.lin1(x))
        return self.lin2(x)


class ForwardDeformer(nn.Module):  # stand-in: num_init canonical candidates per point, as the Broyden search returns
    def __init__(self, num_init=4):
        super().__init__()
        self.num_init = num_init
        self.init_bones = nn.Parameter(torch.randn(num_init, 3) * 0.1)

    def forward(self, xd, cond, tfs, part_type, eval_mode=False):
        with torch.no_grad():
            xc = xd.unsqueeze(2) - self.init_bones - tfs.unsqueeze(2)
            valid_ids = torch.rand(xc.shape[:3]) > 0.3
        return xc, {'valid_ids': valid_ids}


class XAVATARModel(nn.Module):
    def __init__(self, cond_dim=8):
        super().__init__()
        self.shape_net = ImplicitNetwork(cond_dim=cond_dim)
        self.deformer = ForwardDeformer()
        self.representation = 'sdf'
        self.softmax_mode = 'hierarchical'
        self.soft_blend = 5

    def forward(self, pts_d, smpl_tfs, cond, eval_mode=True, is_training=False,
                split_numbers=None, part_type_list=None):

        accum_shape, pts_c_list, mask_list, split_num_list, index_list = [], [], [], [], []

        for part_type, pts_d_split in zip(
                part_type_list, torch.split(pts_d, split_numbers, dim=1)):
            # compute canonical correspondences
            pts_c, intermediates = self.deformer(pts_d_split,
                                                None,
                                                smpl_tfs,
                                                part_type,
                                                eval_mode=eval_mode)

            mask_list.append(intermediates['valid_ids'])
            num_batch, num_point, num_init, num_dim = pts_c.shape
            pts_c = pts_c.reshape(num_batch, num_point * num_init, num_dim)
            pts_c_list.append(pts_c)
            split_num_list.append(pts_c.shape[1])
        pts_c = torch.cat(pts_c_list, dim=1)
        # query shape in canonical space
        shape_pd = self.shape_net(pts_c, cond, return_feature=False)
        shape_pd_list = torch.split(shape_pd, split_num_list, dim=1)

        for shape_pd, mask in zip(shape_pd_list, mask_list):
            num_batch, num_point, num_init = mask.shape
            shape_pd = shape_pd.reshape(num_batch, num_point, num_init)
            # select points with the highest occupancy probablities
            if eval_mode:
                mode = 'max' if self.representation == 'occ' else 'min'
                shape_pd, index = masked_softmax(shape_pd,
                                                mask,
                                                dim=-1,
                                                mode=mode)
            else:
                shape_pd, index = masked_softmax(
                    shape_pd,
                    mask,
                    dim=-1,
                    mode=self.softmax_mode,
                    soft_blend=self.soft_blend)

            accum_shape.append(shape_pd)
            index_list.append(index)

        shape_pd = torch.cat(accum_shape, 1)
        return pts_c, shape_pd, None, None

    def training_step(self, data, data_idx):
        cond = data['smpl_thetas'] / 3.141592653589793

        # shape loss
        _, shape_pd, color_pd, normal_pd = self.forward(data['pts_surf'],
                                                            data['smpl_tfs'],
                                                            cond,
                                                            eval_mode=True,
                                                            is_training=True,
                                                            split_numbers=data['split_numbers'],
                                                            part_type_list=data['part_types'])

        loss = 0.0
        loss_shape = shape_pd.abs().mean()
        loss += loss_shape
        return loss


model = XAVATARModel()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for data_idx in range(3):
    data = {
        'pts_surf': torch.randn(2, 48, 3),
        'smpl_tfs': torch.randn(2, 1, 3) * 0.01,
        'smpl_thetas': torch.randn(2, 8),
        'split_numbers': [32, 8, 8],
        'part_types': ['body', 'hand', 'face'],
    }
    optimizer.zero_grad()
    loss = model.training_step(data, data_idx)
    loss.backward()
    optimizer.step()
    print(data_idx, loss.item())
