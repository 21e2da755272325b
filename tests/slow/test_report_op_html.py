"""check_op's HTML in real headless Chromium: styled, and within an 800-pixel page (no horizontal scroll)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import gradguard

from test_integrations_html import ROOT, _chromium, _screenshot, _where

pytestmark = pytest.mark.slow

FAILURE_RED = (0xCF, 0x22, 0x2E)  # the FAILED summary and the FAILURE tags
CODE_GREY = (0xF6, 0xF8, 0xFA)  # the repro's code block

_MEASURE = ("<script>document.title = 'scroll ' + document.documentElement.scrollWidth + ' of ' + "
            "document.documentElement.clientWidth;</script>")


def test_check_op_html_is_styled_and_fits_the_page(tmp_path):
    sys.path.insert(0, str(ROOT / "examples" / "ops"))
    try:
        from kernels import xsin_ref, xsin_squared_upstream
    finally:
        sys.path.pop(0)
    x = torch.randn(10, generator=torch.Generator().manual_seed(0))
    report = gradguard.check_op(xsin_squared_upstream, x, reference=xsin_ref)
    assert not report.passed and report.failures
    page = tmp_path / "op.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{report.to_html()}"
                    f"{_MEASURE}</body></html>")

    dom = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile-dom'}", "--window-size=800,1000", "--dump-dom",
                          page.resolve().as_uri()], capture_output=True, text=True, timeout=90, check=True).stdout
    scroll, client = map(int, re.search(r"<title>scroll (\d+) of (\d+)</title>", dom).groups())
    assert scroll <= client, f"the report is {scroll} px wide in a {client} px page"

    image = _screenshot(page, tmp_path / "op.png", tmp_path)
    assert _where(image, FAILURE_RED)[0] > 500  # the red summary and tags are drawn
    assert _where(image, CODE_GREY)[0] > 5000  # the repro code sits in its styled block
