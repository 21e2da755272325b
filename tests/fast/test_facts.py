"""Facts: the finding's JSON "context", in the order its facts were set (NOTE [Facts] in core/facts.py)."""

from __future__ import annotations

import json

from gradguard.core.facts import Facts
from gradguard.core.findings import Finding, TensorInfo


def test_constructor_sets_the_facts_given_none_included():
    facts = Facts(call=None, display=[("call", "f.apply")], function="F")
    assert facts.to_dict() == {"function": "F", "call": None, "display": [("call", "f.apply")]}
    assert facts.argument is None and "argument" not in facts.to_dict()


def test_assignment_order_is_the_json_order_and_a_fact_keeps_its_place():
    facts = Facts(user_hooks="layout")
    facts.backward_passes_since_save = 0
    facts.retain_graph = None
    facts.user_hooks = "shape"  # set again: stays first
    assert list(facts.to_dict()) == ["user_hooks", "backward_passes_since_save", "retain_graph"]
    assert facts.to_dict()["user_hooks"] == "shape"


def test_update_is_dict_update():
    facts = Facts(mode="pynative")
    facts.backward_at = {"file": "a.py", "line": 3, "function": "f", "code": "loss.backward()"}
    facts.update(Facts(checked="at the end", backward_at=None))
    assert facts.to_dict() == {"mode": "pynative", "backward_at": None, "checked": "at the end"}


def test_from_dict_round_trips_and_keeps_unknown_keys_in_place():
    data = {"retain_graph": None, "from_a_newer_gradguard": [1, 2], "write_log": False}
    facts = Facts.from_dict(data)
    assert facts.write_log is False and facts.extra == {"from_a_newer_gradguard": [1, 2]}
    assert list(facts.to_dict().items()) == list(data.items())
    assert Facts.from_dict(None).to_dict() == {}


def test_finding_json_context_round_trips_byte_for_byte():
    finding = Finding(kind="silent_write", tensor=TensorInfo((2,), "float32"),
                      facts=Facts(display=[("a", "b")], torch_message="boom"))
    finding.facts.backward_at = None
    text = json.dumps(finding.to_dict())
    assert '"context": {"display": [["a", "b"]], "torch_message": "boom", "backward_at": null}' in text
    assert json.dumps(Finding.from_dict(json.loads(text)).to_dict()) == text
