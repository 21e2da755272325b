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


def _load_run():
    """benchmarks/run.py, which discovers the configurations from gradguard.guard's signature."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gradguard_bench_run", os.path.join(BENCH, "run.py"))
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    return run


RUN = _load_run()


def _guard_configs() -> list[dict]:
    configs, _notes = RUN.discover_guard_configs()
    return configs


def _is_core(config: dict) -> bool:
    """Only fingerprint/track_writes/mode differ from the defaults (not a diagnostic switch such as bisect)."""
    defaults = RUN._guard_defaults()
    return all(k in RUN.CORE or defaults.get(k) == v for k, v in config.items())


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
    # lstmcell_loop with fingerprint="off", track_writes=True is the regression case for interleaved gapped
    # views (the cell's unsafe_chunk gates): a byte-span match once raised a false SilentModificationError.
    # Diagnostic switches (e.g. bisect=True, up to 1000x slower) run on the tiny MLP only, to stay fast.
    for name in zoo.MODELS:
        for config in GUARD_CONFIGS:
            if name != "tiny_mlp" and not _is_core(config):
                continue
            yield pytest.param(name, config, id=name + "-" + ",".join(f"{k}={v}" for k, v in config.items()))


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
