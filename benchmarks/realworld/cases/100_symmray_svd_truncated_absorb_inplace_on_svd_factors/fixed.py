# Reproduction of https://github.com/jcmgray/symmray/pull/2 (symmray/linalg.py before that pull request:
# svd_truncated absorbs the singular values into the U and VH blocks with *=, in place on the factors torch's svd
# saved; the block-sparse AbelianArray shrunk to a dict of blocks keyed by charge sectors, autoray's dispatch
# replaced by the torch functions it picks, and a small gradient-based fit through the truncated svd).
import functools

import torch

torch.manual_seed(0)


class BlockMatrix:
    """A charge-conserving 2D array: one dense block per sector (c0, c1), with c0 == c1 (zero total charge)."""

    def __init__(self, blocks):
        self.blocks = dict(blocks)

    @property
    def sectors(self):
        return tuple(self.blocks.keys())

    def copy_with(self, blocks):
        return BlockMatrix(blocks)


class BlockVector:
    def __init__(self, blocks):
        self.blocks = dict(blocks)


def svd(x):
    _svd = torch.linalg.svd

    u_blocks = {}
    s_store = {}
    v_blocks = {}

    for sector, array in x.blocks.items():
        u, s, v = _svd(array, full_matrices=False)
        u_blocks[sector] = u
        # v charge is 0, and dualnesses always opposite
        s_charge = sector[1]
        v_sector = (s_charge, s_charge)
        s_store[s_charge] = s
        v_blocks[v_sector] = v

    u = x.copy_with(blocks=u_blocks)
    s = BlockVector(s_store)
    v = x.copy_with(blocks=v_blocks)
    return u, s, v


def argsort(seq):
    return sorted(range(len(seq)), key=seq.__getitem__)


@functools.lru_cache(maxsize=2**14)
def calc_sub_max_bonds(sizes, max_bond):
    if max_bond < 0:
        return sizes
    frac = max_bond / sum(sizes)
    if frac >= 1.0:
        return sizes
    sub_max_bonds = [int(frac * sz) for sz in sizes]
    rem = max_bond - sum(sub_max_bonds)
    for i in argsort(sub_max_bonds)[:rem]:
        sub_max_bonds[i] += 1
    return tuple(sub_max_bonds)


def svd_truncated(x, cutoff=-1.0, cutoff_mode=4, max_bond=-1, absorb=0, renorm=0):
    # first perform untruncated svd
    U, s, VH = svd(x)

    # size of each sector
    sector_sizes = tuple(ss.numel() for ss in s.blocks.values())
    # distribute max_bond proportionally to sector sizes
    sub_max_bonds = calc_sub_max_bonds(sector_sizes, max_bond)

    for (c0, c1), n_chi in zip(U.sectors, sub_max_bonds):
        # slice the values and left and right vectors
        U.blocks[(c0, c1)] = U.blocks[(c0, c1)][:, :n_chi]
        s.blocks[c1] = s.blocks[c1][:n_chi]
        VH.blocks[(c1, c1)] = VH.blocks[(c1, c1)][:n_chi, :]

    if absorb is None:
        return U, s, VH

    # absorb the singular values block by block
    for c0, c1 in U.sectors:
        if absorb == -1:
            U.blocks[(c0, c1)] = U.blocks[(c0, c1)] * s.blocks[c1].reshape((1, -1))
        elif absorb == 1:
            VH.blocks[(c1, c1)] = VH.blocks[(c1, c1)] * s.blocks[c1].reshape((-1, 1))
        elif absorb == 0:
            s_sqrt = torch.sqrt(s.blocks[c1])
            U.blocks[(c0, c1)] = U.blocks[(c0, c1)] * s_sqrt.reshape((1, -1))
            VH.blocks[(c1, c1)] = VH.blocks[(c1, c1)] * s_sqrt.reshape((-1, 1))

    return U, None, VH


# Fit a block-sparse matrix whose rank-4 truncation matches a target, by gradient descent through the svd.
params = {(0, 0): torch.randn(4, 4, requires_grad=True), (1, 1): torch.randn(3, 3, requires_grad=True)}
target = {sector: torch.randn(*p.shape) for sector, p in params.items()}
opt = torch.optim.Adam(params.values(), lr=0.01)
for step in range(2):
    x = BlockMatrix(params)
    U, _, VH = svd_truncated(x, max_bond=4, absorb=0)
    loss = sum(((U.blocks[k] @ VH.blocks[k] - target[k]) ** 2).sum() for k in U.sectors)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
