"""The leaf row (core/eager_rules.py) in Paddle's words, on hand-built findings, no framework imported: the facts
Paddle's probe (backends/paddle/eager.py) gives for "Leaf Tensor ... can't use inplace strategy" go in
(``eager_check="leaf"``, Paddle's ``leaf_words``), the exact verdict comes out, and the facts stay out of the JSON."""

from __future__ import annotations

import json

from gradguard.core.diagnosis import diagnose
from gradguard.core.facts import Facts
from gradguard.core.findings import Finding, SourceLocation, TensorInfo, WriteRecord

WHY = ("Paddle accumulates gradients into leaf tensors that do not stop gradient (parameters, tensors created with "
       "stop_gradient=False). Writing one in place while recording gradients would replace the very values the "
       "leaf stands for (an optimizer step then updates from overwritten values), so Paddle refuses the write.")
FIX = ("For a parameter update or initialisation, write under `with paddle.no_grad():`. For a computation, write out "
       "of place (`y = paddle.sin(x)` instead of `x.sin_()`), or clone first (`y = x.clone(); y.sin_()`).")


def _paddle_leaf(written: str, role: str, code: str, made: SourceLocation | None = None) -> Finding:
    """A finding as Paddle's probe gives it for the leaf write ``code`` at train.py:3."""
    return diagnose(Finding(
        kind="leaf_inplace", tensor=TensorInfo((3,), "float32", name=written, role=role), backend="paddle",
        modified_at=[WriteRecord("in-place write", SourceLocation("/tmp/train.py", 3, "<module>", code))],
        facts=Facts(mode="eager (dygraph)", display=[("paddle name", "generated_tensor_0")], eager_check="leaf",
                    written=written, made_at=made, paddle_message="(InvalidArgument) Leaf Var (generated_tensor_0) "
                    "that doesn't stop gradient can't use inplace strategy.", leaf_words=(WHY, FIX))))


def test_a_paddle_leaf_is_worded_in_paddles_terms_without_an_edit():
    made = SourceLocation("/tmp/train.py", 2, "<module>", "x = paddle.to_tensor([1.0], stop_gradient=False)")
    f = _paddle_leaf("x", "leaf", "x.sin_()", made)
    assert (f.kind, f.rule, f.headline) == (
        "leaf_inplace", "leaf_inplace", "an in-place operation was applied to a leaf tensor that requires grad")
    assert f.explanation == WHY
    assert f.suggestion == FIX
    assert f.fixes == []  # the torch rows' edits (torch.no_grad) are not Paddle's
    assert f.facts.display == [("created at", "/tmp/train.py:2: x = paddle.to_tensor([1.0], stop_gradient=False)"),
                               ("paddle name", "generated_tensor_0")]


def test_a_paddle_parameter_gets_no_nn_module_line():
    f = _paddle_leaf("net.weight", "parameter", "net.weight[0] = 1.0")
    assert (f.explanation, f.suggestion, f.fixes) == (WHY, FIX, [])
    assert f.facts.display == [("paddle name", "generated_tensor_0")]  # torch's row says "created by nn.Module"


def test_the_framework_fact_stays_out_of_the_json():
    f = _paddle_leaf("x", "leaf", "x.sin_()")
    context = f.to_dict()["context"]
    assert list(context) == ["mode", "display", "paddle_message"]
    text = json.dumps(f.to_dict())
    assert json.dumps(Finding.from_dict(json.loads(text)).to_dict()) == text


def test_torch_words_stay_torchs():
    f = diagnose(Finding(kind="leaf_inplace", tensor=TensorInfo((3,), "float32", name="x", role="leaf"),
                         modified_at=[WriteRecord("in-place write",
                                                  SourceLocation("/tmp/train.py", 3, "<module>", "x.add_(1)"))],
                         facts=Facts(display=[], eager_check="leaf", written="x")))
    assert f.explanation.endswith("so PyTorch refuses the write.") and f.fixes
