"""`torchrun --nproc-per-node 2 -m gradguard run ...` with 2 real processes on CPU (gloo)."""

import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "integrations"

DDP_WHY = (
    "Its bytes changed while its version counter did not, so the framework's own check cannot see it. "
    "DistributedDataParallel's forward at examples/integrations/ddp_buffer_broadcast.py:35 copied rank 0's "
    "buffers into this rank's buffers in place (broadcast_buffers=True, the default), after MulBackward0.other "
    "had saved this buffer in an earlier forward pass whose backward had not run yet: that backward would use "
    "rank 0's values, not the ones its forward used. (PyTorch >= 2.13 keeps the version counter during this "
    "broadcast, so it computes the gradient silently wrong; earlier versions raise \"modified by an inplace "
    "operation\".)"
)
DDP_FIX = (
    "Run backward after each forward through the DDP model, or put both batches through one forward (torch.cat); "
    "or construct DDP with broadcast_buffers=False (forward_sync_buffers=False in PyTorch >= 2.13) and keep the "
    "buffers in sync yourself; for BatchNorm, convert the model with "
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)."
)


def _torchrun(script, tmp_path, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "gradguard", "run", "--json", str(tmp_path / "report.json"), "--html",
               str(tmp_path / "report.html"), str(script.relative_to(ROOT))]
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - start


def _reports(tmp_path):
    return [json.loads((tmp_path / f"report.rank{rank}.json").read_text())["findings"] for rank in (0, 1)]


def test_one_failing_rank_reports_and_no_rank_hangs(tmp_path):
    done, seconds = _torchrun(EXAMPLES / "ddp_rank_bug.py", tmp_path)
    assert done.returncode != 0
    assert seconds < 60, f"took {seconds:.0f}s: a rank waited for the one that failed"
    rank0, rank1 = _reports(tmp_path)
    assert rank0 == []  # rank 0 had no hazard: it stopped because its peer left
    assert [(f["kind"], f["rule"], f["context"]["rank"], f["context"]["world_size"], f["rank"]) for f in rank1] == [
        ("inplace_modification", "inplace_activation", 1, 2, 1)]
    assert rank1[0]["saved_at"]["op"] == "SigmoidBackward0.result"
    assert "gradguard: InplaceModificationError on rank 1" in done.stderr
    assert "rank 0 done" not in done.stdout and "rank 1 done" not in done.stdout
    html = (tmp_path / "report.rank1.html").read_text()
    assert "rank 1 of 2" in html and 'data-rule="inplace_activation"' in html
    assert "No gradient hazards found." in (tmp_path / "report.rank0.html").read_text()


def test_ddp_buffer_broadcast_is_recognised_and_explained(tmp_path):
    done, seconds = _torchrun(EXAMPLES / "ddp_buffer_broadcast.py", tmp_path)
    assert done.returncode != 0
    rank0, rank1 = _reports(tmp_path)
    # Rank 1: DDP's broadcast silently rewrote the buffer its first forward saved.
    assert [(f["kind"], f["rule"], f["tensor"]["label"]) for f in rank1] == [
        ("silent_write", "ddp_broadcast", "buffer model.module.scale (float32[4])")]
    finding = rank1[0]
    assert finding["explanation"] == DDP_WHY
    assert finding["suggestion"] == DDP_FIX
    write = finding["modified_at"][0]
    assert (write["op"], write["bumps_version"], write["library_frame"].split(":")[0]) == (
        "aten.copy_", False, "torch/nn/parallel/distributed.py")
    graph = finding["context"]["graph"]
    assert [(n["label"], e["label"]) for n in graph["nodes"] for e in graph["edges"]
            if n["type"] == "write" and e["from"] == n["id"]] == [
        ("aten.copy_ via DDP buffer broadcast", "version 1 -> 1, no version bump")]
    # Rank 0: its own in-place update of the buffer is the bug there, not DDP. Both ranks fail in the same
    # backward; when rank 1 fails first, torchrun stops rank 0 before its backward reaches the buffer (a race of
    # the launcher, seen on a loaded machine): then rank 0's report is empty, as for any rank stopped by its peer.
    assert [(f["kind"], f["context"]["rank"]) for f in rank0] in ([("inplace_modification", 0)], [])
    assert all(f["rule"] != "ddp_broadcast" for f in rank0)
    # Its console line, unless the launcher stopped rank 1 after its report was written and before it printed (the
    # same race: rank 0 failed first and torchrun sent the other rank its closing signal).
    stopped = "closing signal" in done.stderr
    assert stopped or "gradguard: SilentModificationError on rank 1" in done.stderr
