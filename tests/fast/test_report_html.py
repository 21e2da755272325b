"""HTML report details on a real finding (the GAN ordering bug of examples/integrations/html_report_demo.py):
code spans instead of literal backticks, one box for the stale tensor, write labels that keep the line."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import gradguard
from gradguard.report.html import _write_detail, finding_html, graph_svg


@pytest.fixture(scope="module")
def gan_finding():
    torch.manual_seed(0)
    generator = nn.Linear(4, 4)
    discriminator = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt_d = torch.optim.SGD(discriminator.parameters(), lr=0.1)
    with pytest.raises(gradguard.InplaceModificationError) as caught:
        with gradguard.guard(track_writes=True):
            fake = generator(torch.randn(16, 4))
            d_loss = discriminator(fake.detach()).mean()
            g_loss = -discriminator(fake).mean()
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss.backward()
    return caught.value.finding


def test_code_spans_are_code_not_backticks(gan_finding):
    assert "`" in gan_finding.suggestion  # the text form marks code with backticks ...
    page = finding_html(gan_finding)
    facts = page.split('<div class="graph">')[0]
    assert "`" not in facts  # ... the page sets it as code
    assert "<code>opt_d.step()</code>" in facts


def test_the_stale_tensor_is_drawn_once(gan_finding):
    graph = gan_finding.facts.graph
    alias = [n for n in graph["nodes"] if n.get("stale_alias")]
    assert [n["label"] for n in alias] == ["discriminator.2.weight"]  # the parameter the saved view reads
    svg = graph_svg(graph)
    assert svg.count('class="gg-node gg-stale"') == 1 and "gg-leaf_stale" not in svg
    stale = re.search(r'<g class="gg-node gg-stale".*?</g>', svg, re.S).group(0)
    # One box: the tensor as saved ([8, 1], mat2 = weight.t()), and the parameter it views ([1, 8]).
    assert "parameter discriminator.2.weight (float32[8, 1])" in stale
    assert "version saved 1, now 2; view of parameter float32[1, 8]" in stale
    assert svg.count("gg-edge-alias") == 1  # TBackward0's input is that same box


def test_write_label_keeps_the_line_number(gan_finding):
    (write,) = gan_finding.modified_at
    line = write.location.line
    long_path = "/home/someone/projects/a-rather-long-project-name/training/scripts/train_gan.py"
    detail = f"at {long_path}:{line}: opt_d.step()  # updates the discriminator's weights in place"
    cut = _write_detail(detail)
    assert cut.startswith(f"at train_gan.py:{line}: opt_d.step()  # updates the discrimin")
    assert cut.endswith("\u2026") and len(cut) == 58  # the box's width in characters
    assert _write_detail(f"at short.py:{line}: opt_d.step()") == f"at short.py:{line}: opt_d.step()"
    svg = graph_svg(gan_finding.facts.graph)
    box = re.search(r'<g class="gg-node gg-write".*?</g>', svg, re.S).group(0)
    assert re.search(rf"test_report_html\.py:{line}\b", box), box
