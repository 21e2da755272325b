"""Smoke test for the benchmark zoo: every model runs one step under plain PyTorch and under each gradguard
configuration the benchmark would measure, and the guarded step leaves parameters, gradients and buffers
bit-identical to the plain one. No timing assertions."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks")
sys.path.insert(0, os.path.abspath(BENCH))

import zoo  # noqa: E402

import gradguard  # noqa: E402


def _guard_configs() -> list[dict]:
    """The configurations benchmarks/run.py discovers from gradguard.guard's signature."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gradguard_bench_run", os.path.join(BENCH, "run.py"))
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    configs, _notes = run.discover_guard_configs()
    return configs


GUARD_CONFIGS = _guard_configs()


def _one_step(name: str, context) -> dict:
    w = zoo.build(name, seed=0)
    with context:
        w.step(seed=1)
    return w.state()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def plain_states():
    import contextlib

    return {name: _one_step(name, contextlib.nullcontext()) for name in zoo.MODELS}


def test_discovers_fingerprint_and_write_configs():
    assert GUARD_CONFIGS, "no gradguard.guard configuration discovered"
    fps = {c.get("fingerprint") for c in GUARD_CONFIGS}
    writes = {c.get("track_writes") for c in GUARD_CONFIGS}
    assert {"full", "sample", "off"} <= fps or fps == {None}
    assert {True, False} <= writes or writes == {None}


def test_plain_step_is_deterministic(plain_states):
    import contextlib

    again = _one_step("tiny_mlp", contextlib.nullcontext())
    for key, value in plain_states["tiny_mlp"].items():
        assert torch.equal(value, again[key]), key


def _cases():
    for name in zoo.MODELS:
        for config in GUARD_CONFIGS:
            marks = ()
            if name == "lstmcell_loop" and config.get("fingerprint") == "off" and config.get("track_writes"):
                # Known false positive: lstm_cell's four unsafe_chunk gate views interleave row by row; the
                # ledger matches writes by byte *span*, so outgate.sigmoid_() "overlaps" the saved
                # cellgate.tanh_() result, and with fingerprint="off" _unpack raises on the write alone.
                marks = pytest.mark.xfail(raises=gradguard.SilentModificationError, strict=False,
                                          reason="span-overlap false positive on interleaved views")
            yield pytest.param(name, config, marks=marks,
                               id=name + "-" + ",".join(f"{k}={v}" for k, v in config.items()))


@pytest.mark.parametrize("name,config", list(_cases()))
def test_guarded_step_is_bit_identical(name, config, plain_states):
    guarded = _one_step(name, gradguard.guard(**config))
    plain = plain_states[name]
    assert guarded.keys() == plain.keys()
    for key, value in plain.items():
        other = guarded[key]
        if value is None:
            assert other is None, key
            continue
        assert value.dtype == other.dtype and value.shape == other.shape, key
        assert torch.equal(value, other), f"{name} under guard({config}): {key} differs from plain"
