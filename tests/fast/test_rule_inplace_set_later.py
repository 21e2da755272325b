"""Rule ``inplace_flag_set_later``: a module built out of place and switched to in-place afterwards
(``self.drop.inplace = True``). The explanation and the fix name that statement, not the constructor; the fix
deletes it. Run under the real guard in forensic mode, through ``gradguard run`` (which re-runs in forensic mode
by itself) and through ``gradguard fix --apply``."""

from __future__ import annotations

import json
import linecache
import subprocess
import sys
import textwrap

import pytest

import gradguard

SWITCHED = """
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.act = nn.Sigmoid()
            self.drop = nn.Dropout(0.5)
            self.drop.inplace = True
        def forward(self, x):
            return self.drop(self.act(self.fc(x)))


    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 4)
    net(x).sum().backward()
    print("ok")
"""

EXPLANATION = ("The in-place module self.drop (Dropout(inplace=True)) at line 13 overwrote the output of sigmoid, "
               "which SigmoidBackward0.result saved for backward: sigmoid's gradient is computed from its output s "
               "as s * (1 - s). Its constructor built it out of place (line 10: `self.drop = nn.Dropout(0.5)`); "
               "`self.drop.inplace = True` at line 11 switched it to in-place afterwards.")
SUGGESTION = ("Delete `self.drop.inplace = True` (line 11), or set it to False: self.drop then computes out of place "
              "and leaves the saved output intact. An in-place op is safe only right after an op that does not "
              "save its output (Linear, Conv, BatchNorm).")
INTENTS = [{"action": "remove_statement", "line": 11, "target": "self.drop.inplace = True", "detail": {},
            "reason": "`self.drop.inplace = True` switched self.drop to in-place after it was constructed",
            "preferred": True}]


def _script(tmp_path, text: str = SWITCHED):
    path = tmp_path / "repro.py"
    path.write_text(textwrap.dedent(text).lstrip())
    linecache.checkcache(str(path))
    return path


def _intents(fixes) -> list[dict]:
    return [{k: v for k, v in (x if isinstance(x, dict) else x.to_dict()).items() if k != "file"} for x in fixes]


def test_guarded_in_forensic_mode(tmp_path):
    path = _script(tmp_path)
    source = path.read_text().replace("net(x).sum().backward()",
                                      "with gradguard.guard(track_writes=True):\n    net(x).sum().backward()")
    with pytest.raises(gradguard.GradientHazardError) as caught:
        exec(compile(source, str(path), "exec"), {"__name__": "__main__", "gradguard": gradguard})
    f = caught.value.finding
    assert f.rule == "inplace_flag_set_later"
    assert f.explanation == EXPLANATION
    assert f.suggestion == SUGGESTION
    assert _intents(f.fixes) == INTENTS
    assert f.fixes[0].file == str(path)


def test_gradguard_run_reruns_in_forensic_mode_and_reports_the_rule(tmp_path):
    _script(tmp_path)
    run = subprocess.run([sys.executable, "-m", "gradguard", "run", "--json", "out.json", "repro.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    [finding] = json.loads((tmp_path / "out.json").read_text())["findings"]
    assert finding["rule"] == "inplace_flag_set_later"
    assert finding["explanation"] == EXPLANATION
    assert finding["suggestion"] == SUGGESTION
    assert _intents(finding["fixes"]) == INTENTS


def test_gradguard_fix_apply_deletes_the_switch(tmp_path):
    _script(tmp_path)
    run = subprocess.run([sys.executable, "-m", "gradguard", "fix", "--apply", "repro.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    edited = (tmp_path / "repro.py").read_text()
    assert "self.drop.inplace = True" not in edited
    assert "self.drop = nn.Dropout(0.5)" in edited
    plain = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "ok"
