"""The notebook view of gradguard errors, in a real Jupyter kernel (ipykernel driven by nbclient): after
``%load_ext gradguard`` (or ``register()``) an uncaught hazard error shows the finding as HTML and text with
IPython's cell names, then IPython's traceback; other errors keep IPython's own traceback."""

from __future__ import annotations

import re

import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.slow

_HAZARD = """\
import torch, gradguard
x = torch.randn(3, requires_grad=True)
with gradguard.guard():
    y = x.sigmoid()
    y.mul_(2)
    y.sum().backward()
"""


def _run(cells: list[str]) -> list:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbclient.NotebookClient(notebook, kernel_name="python3", allow_errors=True, timeout=180).execute()
    return [cell.outputs for cell in notebook.cells]


def test_hazard_in_a_cell_shows_the_finding_with_cell_names():
    outputs = _run([
        "%load_ext gradguard",
        _HAZARD,
        "gradguard.integrations.jupyter.register()\nraise ValueError('the user error')",
        "1 + 1",
    ])
    assert outputs[0] == []

    display, error = outputs[1]
    assert display["output_type"] == "display_data"
    html, text = display["data"]["text/html"], display["data"]["text/plain"]
    assert 'class="gg-report"' in html and "<svg" in html
    assert "<code>Cell In[2]:4</code>" in html and "<pre class=\"src\">y.mul_(2)</pre>" in html
    assert "SigmoidBackward0.result, saved in the forward call at Cell In[2]:4" in text
    assert "aten.mul_.Tensor at Cell In[2]:5" in text
    assert "ipykernel" not in html + text

    assert error["output_type"] == "error" and error["ename"] == "InplaceModificationError"
    assert error["evalue"] == ("a tensor saved for backward was modified in place before backward used it "
                               "(gradguard's finding is shown above; the exception's .finding holds it)")
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))
    assert "Cell In[2], line 6" in traceback and "ipykernel_" not in traceback
    assert "site-packages" not in traceback and "gradguard/backends" not in traceback  # the user's frames only

    # Another exception type: IPython's own traceback, untouched; the kernel goes on.
    (other,) = outputs[2]
    assert (other["output_type"], other["ename"], other["evalue"]) == ("error", "ValueError", "the user error")
    assert outputs[3][0]["data"]["text/plain"] == "2"
