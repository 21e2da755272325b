"""End to end: state a module keeps between forwards that no statement of its class assigns (a cache made with
``register_buffer`` or ``setattr``) carries the previous step's graph into the next backward. The crossing is
found by walking the graph to the module's buffers, and ``gradguard fix --apply`` detaches the state where the
module reads it back, with the edit asserted and the edited script run again, plain, to a clean exit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow


def _run(tmp_path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=600)


# A positional table cached on first use (the pattern of rotary and sinusoidal embeddings): the cache is made from
# a learned scale, so after the first step it holds that step's graph.
BUFFER_CACHE = """
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Positions(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(dim))
            self.register_buffer("table", None, persistent=False)

        def forward(self, n):
            if self.table is not None and self.table.shape[0] >= n:
                return self.table[:n]
            table = torch.arange(n).float()[:, None] * self.scale
            self.register_buffer("table", table, persistent=False)
            return table


    positions = Positions(4)
    head = nn.Linear(4, 1)
    optimizer = torch.optim.SGD([*positions.parameters(), *head.parameters()], lr=0.1)
    for step in range(3):
        loss = head(torch.randn(5, 4) + positions(5)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("ok", round(loss.item(), 4))
"""


def test_buffer_cache_crossing_is_named_and_detached_where_read(tmp_path):
    script = tmp_path / "repro.py"
    script.write_text(textwrap.dedent(BUFFER_CACHE).lstrip())
    found = _run(tmp_path, "-m", "gradguard", "run", "--json", "out.json", "repro.py")
    assert found.returncode == 1, found.stderr
    finding = json.loads((tmp_path / "out.json").read_text())["findings"][0]
    assert finding["kind"] == "backward_twice"
    assert finding["tensor"]["name"] == "positions.table"
    assert finding["fixes"][0]["action"] == "detach_expression"
    assert "`self.table.detach()` in `return self.table[:n]` (line 15)" in finding["suggestion"]

    fixed = _run(tmp_path, "-m", "gradguard", "fix", "--apply", "repro.py")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "            return self.table.detach()[:n]\n" in script.read_text()
    plain = _run(tmp_path, "repro.py")
    assert plain.returncode == 0 and plain.stdout.startswith("ok"), plain.stderr
