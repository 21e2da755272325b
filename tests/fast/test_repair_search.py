"""The general repair search of ``gradguard fix`` (NOTE [Repairs from the mechanism, not the rule id]): the
out-of-place table read from the tensor type, the module instance resolved to its construction, and the one
rewrite behind both the suggestion text and the edit. End to end (``gradguard fix --apply`` on reproductions of
public reports): tests/slow/test_fix_repair_search.py."""

from __future__ import annotations

import textwrap

import pytest


@pytest.mark.parametrize("code, expected", [
    ("x.normal_()", None),
    ("x.zero_()", None),
    ("x.bernoulli_(0.5)", None),
    ("angles = angles.div_(n)", "angles = angles.div(n)"),
    ("y = x.clamp_(0, 1)", "x = x.clamp(0, 1); y = x"),
    ("out = a - t.mul_(k)", "t = t.mul(k); out = a - t"),
    ("return e.renorm_(2, 0, 1.0)", "e = e.renorm(2, 0, 1.0); return e"),
    ("x.index_add_(0, i, v)", "x = x.index_add(0, i, v)"),
    ("torch.sigmoid_(x)", "x = torch.sigmoid(x)"),
    ("F.relu(x, inplace=True)", "x = F.relu(x)"),
    ("h *= 0.5", "h = h * 0.5"),
])
def test_the_out_of_place_table_comes_from_the_tensor_type(code, expected):
    from gradguard.core._fixes import out_of_place

    assert out_of_place(code) == expected


def test_module_sites_follow_sequential_comprehension_and_factory(tmp_path):
    from gradguard.core._module_sites import inplace_switches, instance_sites

    source = tmp_path / "model.py"
    source.write_text(textwrap.dedent("""
        import torch.nn as nn


        def act():
            return nn.ReLU(inplace=True)


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.ModuleList([nn.ReLU(inplace=True) for _ in range(3)])
                self.body = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True), nn.ReLU(inplace=True))
                self.tail = nn.Sequential(nn.Linear(2, 2), act())
                for m in self.modules():
                    m.inplace = True
        """).lstrip())
    files = [str(source)]
    assert [(s.location.line, s.occurrence) for s in instance_sites(files, "self.blocks.1", "ReLU")] == [(11, None)]
    assert [(s.location.line, s.occurrence) for s in instance_sites(files, "net.body.2", "ReLU")] == [(12, 1)]
    assert [(s.location.line, s.occurrence) for s in instance_sites(files, "net.tail.1", "ReLU")] == [(5, None)]
    assert instance_sites(files, "net.body.5", "ReLU") == []
    assert [s.line for s in inplace_switches(files, "net.tail")] == [15]


def test_suggestion_text_and_edit_come_from_one_rewrite(tmp_path):
    """The hunk gradguard fix applies is the statement the suggestion shows."""
    from gradguard.core._intents import FixIntent
    from gradguard.core._fixes import out_of_place
    from gradguard.fix import apply_intent

    code = "y = x.div_(n)  # normalise\n"
    text = out_of_place(code)
    edited = apply_intent(code, FixIntent("inplace_to_out_of_place", "f.py", 1))
    assert "; ".join(line.split("#")[0].strip() for line in edited.splitlines()) == text
