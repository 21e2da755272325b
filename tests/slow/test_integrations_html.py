"""The HTML report end to end: `gradguard run --html`, rendered by real headless Chromium, screenshot checked.

Needs the `chromium` binary (Debian: `apt-get install -y chromium`); a missing browser fails the test."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
from PIL import Image

from gradguard.core.findings import Finding, SaveSite, TensorInfo
from gradguard.report.html import render_html

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = "examples/integrations/html_report_demo.py"

# Box fills in the SVG (report/html.py _STYLE): exact colours, so the screenshot can be measured.
SAVER_FILL = (0xFF, 0xF3, 0xDC)
STALE_FILL = (0xFD, 0xE7, 0xE7)
WRITE_FILL = (0xFF, 0xF0, 0xF0)
LEAF_FILL = (0xEC, 0xF7, 0xEC)
RED_STROKE = (0xC6, 0x28, 0x28)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("headless Chromium is needed for this test: apt-get install -y chromium")


def _screenshot(html: pathlib.Path, png: pathlib.Path, tmp_path: pathlib.Path) -> np.ndarray:
    command = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--screenshot={png}", "--window-size=1200,1400",
        html.resolve().as_uri(),
    ]
    subprocess.run(command, capture_output=True, timeout=90, check=True)
    return np.asarray(Image.open(png).convert("RGB"))


def _where(image: np.ndarray, colour) -> tuple[int, float, float]:
    """(pixel count, mean x, mean y) of the pixels exactly this colour."""
    ys, xs = np.nonzero(np.all(image == np.array(colour, dtype=image.dtype), axis=-1))
    return len(xs), (xs.mean() if len(xs) else -1.0), (ys.mean() if len(ys) else -1.0)


def test_gradguard_run_html_report_shows_the_finding_and_the_graph(tmp_path):
    html = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "gradguard", "run", "--html", str(html), "--json",
                           str(tmp_path / "report.json"), DEMO], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    # The notice is wrapped at the output width (a long path goes whole onto its own line).
    assert " ".join(done.stderr.split()).endswith(f"gradguard: HTML report: {html}")
    text = html.read_text()
    # Self-contained: nothing fetched from anywhere.
    assert not re.search(r"<script|<link|<img|src=|@import|url\((?!#)", text)
    assert text.count("<svg") == 1
    finding = json.loads((tmp_path / "report.json").read_text())["findings"][0]
    graph = finding["context"]["graph"]
    saver = next(n for n in graph["nodes"] if n["id"] == graph["saver"])
    stale = next(n for n in graph["nodes"] if n["id"] == graph["stale"])
    writes = [n for n in graph["nodes"] if n["id"] in graph["writes"]]
    assert (saver["name"], saver["role"]) == ("AddmmBackward0", "saver")
    assert stale["label"] == "parameter discriminator.2.weight (float32[8, 1])"
    assert [w["label"] for w in writes] == ["aten.add_.Tensor via SGD.step()"]
    assert {"from": graph["saver"], "to": graph["stale"], "kind": "saved", "label": "saved mat2"} in graph["edges"]
    assert [n["label"] for n in graph["nodes"] if n.get("stale_alias")] == ["discriminator.2.weight"]
    for label in ("AddmmBackward0", "saved mat2", "parameter discriminator.2.weight (float32[8, 1])",
                  "aten.add_.Tensor via SGD.step()", "version 1 -&gt; 2", finding["headline"]):
        assert label in text

    image = _screenshot(html, tmp_path / "report.png", tmp_path)
    assert image.shape == (1400, 1200, 3)
    saver_px, saver_x, saver_y = _where(image, SAVER_FILL)
    stale_px, stale_x, stale_y = _where(image, STALE_FILL)
    write_px, write_x, write_y = _where(image, WRITE_FILL)
    leaf_px, _, leaf_y = _where(image, LEAF_FILL)
    red_px, _, _ = _where(image, RED_STROKE)
    # Every box is drawn (a 120x46 box is ~4000 px of fill) ...
    assert saver_px > 3000 and stale_px > 3000 and write_px > 3000 and leaf_px > 3000
    assert red_px > 1500  # stale tensor, write box, the write arrow, the stale parameter's frame
    # ... where the layout puts it: stale tensor right of the saver, the write below the stale tensor,
    # the inputs (parameters) below the saver, and the graph below the text of the finding.
    assert stale_x > saver_x + 200 and abs(stale_y - saver_y) < 15
    assert write_y > stale_y + 60 and abs(write_x - stale_x) < 120
    assert leaf_y > saver_y + 60
    assert saver_y > 400


def test_html_report_without_a_graph_or_findings_still_renders(tmp_path):
    finding = Finding(kind="leaf_inplace", tensor=TensorInfo(shape=(2,), dtype="float32", role="leaf"),
                      saved_at=SaveSite(), headline="an in-place operation was applied to a leaf tensor",
                      explanation="<why & how>", suggestion="use torch.no_grad()")
    page = render_html([finding], script="train.py")
    assert "<svg" not in page  # no graph captured: no picture, and no error
    assert "&lt;why &amp; how&gt;" in page  # user-facing text is escaped
    assert "<title>gradguard: 1 finding (train.py)</title>" in page
    empty = render_html([], script="train.py", rank=1, world_size=2, exit_code=0)
    assert '<p class="none">No gradient hazards found.</p>' in empty
    assert "rank 1 of 2" in empty
    path = tmp_path / "empty.html"
    path.write_text(empty)
    image = _screenshot(path, tmp_path / "empty.png", tmp_path)
    assert _where(image, (0xC6, 0x28, 0x28))[0] > 100  # the red "gradguard" title is drawn
    assert os.path.getsize(tmp_path / "empty.png") > 0


def test_notebook_view_of_a_real_finding(tmp_path):
    import torch

    import gradguard
    from gradguard.report import render_finding
    from gradguard.report.html import notebook_html

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    caught = None
    try:
        with gradguard.guard() as g:
            loss = model(torch.randn(2, 3)).sum()
            loss.backward(retain_graph=True)
            opt.step()
            loss.backward()
    except gradguard.InplaceModificationError as error:
        caught = error
    # The details live in the exception and in the guard's findings, not only in a warning.
    assert g.findings == [caught.finding]
    bundle = caught._repr_mimebundle_()
    # The text fallback: the whole message, PyTorch's own sentence first, then the finding as rendered.
    assert bundle["text/plain"] == str(caught)
    assert str(caught).startswith("one of the variables needed for gradient computation has been modified by an "
                                  "inplace operation: [torch.FloatTensor [3, 1]]")
    assert str(caught).endswith("\n\ngradguard: " + render_finding(caught.finding))
    assert "text/html" in bundle
    # The styled cell: scoped CSS (no rule for the notebook's own body), the facts and the graph picture.
    cell = notebook_html(caught.finding)
    assert cell.startswith('<div class="gg-report"><style>') and "body{" not in cell
    assert cell.count("<svg") == 1 and "saved mat2" in cell
    page = tmp_path / "cell.html"
    page.write_text(f"<!DOCTYPE html><html><body style='margin:0'>{cell}</body></html>")
    image = _screenshot(page, tmp_path / "cell.png", tmp_path)
    assert _where(image, SAVER_FILL)[0] > 3000 and _where(image, STALE_FILL)[0] > 3000
    assert _where(image, WRITE_FILL)[0] > 3000
