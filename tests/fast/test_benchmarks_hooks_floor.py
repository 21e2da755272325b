"""The benchmark's hooks floor (``benchmarks/run.py --hooks-floor``, NOTE [The hooks floor]) and sampled rows on both
paths (``--sampled-paths``): bare saved-tensor hooks leave a step bit-identical to plain, the device-path table
renders their rows, and ``benchmarks/device_path_breakdown.py`` renders its table. No timing assertions."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys

import pytest

torch = pytest.importorskip("torch")

BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks"))
sys.path.insert(0, BENCH)

import zoo  # noqa: E402


def _load(name: str, filename: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUN = _load("_h32_bench_run", "run.py")


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _state(context) -> dict:
    w = zoo.build("tiny_mlp", seed=0)
    with context():
        w.step(seed=1)
        w.step(seed=2)
    return w.state()


@pytest.mark.parametrize("label", list(RUN.HOOKS_FLOOR))
def test_floor_hooks_leave_the_step_bit_identical(label):
    plain = _state(contextlib.nullcontext)
    floor = _state(RUN.HOOKS_FLOOR[label])
    assert plain.keys() == floor.keys()
    for key, value in plain.items():
        other = floor[key]
        assert (value is None) == (other is None), key
        if value is not None:
            assert torch.equal(value, other), key


def test_floor_hooks_are_called_once_per_saved_tensor():
    calls = {"pack": 0, "unpack": 0}
    w = zoo.build("tiny_mlp", seed=0)
    saved = RUN.count_per_step(w)["saved"]
    original = torch.autograd.graph.saved_tensors_hooks

    class Counting(original):
        def __init__(self, pack, unpack):
            def counted_pack(t):
                calls["pack"] += 1
                return pack(t)

            def counted_unpack(p):
                calls["unpack"] += 1
                return unpack(p)

            super().__init__(counted_pack, counted_unpack)

    for label, factory in RUN.HOOKS_FLOOR.items():
        calls.update(pack=0, unpack=0)
        torch.autograd.graph.saved_tensors_hooks = Counting
        try:
            context = factory()
        finally:
            torch.autograd.graph.saved_tensors_hooks = original
        with context:
            w.step()
        assert calls["pack"] == saved, label
        assert 0 < calls["unpack"] <= saved, label


def test_options_parse():
    args = RUN.parse_args(["--device-rows-only", "--hooks-floor", "--sampled-paths", "cpu,device"])
    assert args.hooks_floor and args.sampled_paths == ("cpu", "device")
    assert RUN.parse_args(["--sampled-paths", "none"]).sampled_paths == ()
    assert RUN.parse_args([]).sampled_paths == ("device",) and not RUN.parse_args([]).hooks_floor
    with pytest.raises(SystemExit):
        RUN.parse_args(["--sampled-paths", "gpu"])


def test_device_rows_with_the_floor_and_both_sampled_paths():
    args = argparse.Namespace(hooks_floor=True, sampled_paths=("cpu", "device"), sample_ms=1.0, max_rounds=1,
                              warmup_rounds=0, budget_s=0.0, min_rounds=1, quick=True)
    rows = RUN.device_rows(["tiny_mlp"], args, "cpu", 2)
    row = rows["tiny_mlp"]
    for key in list(RUN.HOOKS_FLOOR) + ["cpu path", "device path", "sampled", "sampled cpu"]:
        assert row[key] > 0, key
    assert row["syncs"] == row["passes"] == 1
    text = RUN.render_device_rows(rows, 2)
    for title in ("hooks floor: identity", "hooks floor: one tiny op", "hooks floor: sample copies",
                  "sentinel sampled 1/2, CPU path", "sentinel sampled 1/2, device path"):
        assert f"| {title} |" in text, title


def test_breakdown_renders():
    breakdown = _load("_h32_breakdown", "device_path_breakdown.py")
    assert set(RUN.HOOKS_FLOOR) < set(breakdown.configs())
    result = {"saved": 10, "rounds": 3, "inner": 1,
              "rows": {"plain": {"ms": 1.0, "ratio": 1.0, "p25": 1.0, "p75": 1.0, "us_per_saved": 0.0},
                       "sentinel, device path": {"ms": 2.0, "ratio": 2.0, "p25": 1.9, "p75": 2.1,
                                                 "us_per_saved": 100.0}}}
    text = breakdown.render("tiny_mlp", result)
    assert "| sentinel, device path | 2.00 | 2.00× (1.90-2.10) | 100.0 |" in text
