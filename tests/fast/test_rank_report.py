"""A torchrun rank's report survives a SIGTERM that lands while it is being written (NOTE [A SIGTERM during the
report] in gradguard/integrations/distributed.py). Framework-free: run in a child process with a fake rank."""

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    from gradguard.integrations.distributed import RankInfo, report_on_termination

    path, when = sys.argv[1], sys.argv[2]

    def write(exit_code):
        with open(path, "a") as handle:
            handle.write(json.dumps({"part": 1, "exit_code": exit_code}) + "\\n")
            if when == "during":
                os.kill(os.getpid(), signal.SIGTERM)  # the agent's SIGTERM, in the middle of the write
            for _ in range(1000):  # Python code runs on: a pending, unblocked handler would run here
                pass
            handle.write(json.dumps({"part": 2}) + "\\n")

    report = report_on_termination(write, RankInfo(rank=0, world_size=2))
    if when == "before":
        os.kill(os.getpid(), signal.SIGTERM)  # the agent's SIGTERM, before the script's end
    report.write(1)
    print("not reached: the pending SIGTERM ends the rank after the write")
""")


def _run(tmp_path, when):
    target = tmp_path / "report.jsonl"
    done = subprocess.run([sys.executable, "-c", CHILD, str(target), when], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return done, [json.loads(line) for line in target.read_text().splitlines()]


def test_sigterm_during_the_report_waits_for_it_and_does_not_write_it_twice(tmp_path):
    done, lines = _run(tmp_path, "during")
    assert lines == [{"part": 1, "exit_code": 1}, {"part": 2}]  # one whole report, written once
    assert done.returncode == 128 + 15  # then the rank exits as SIGTERM asked
    assert "not reached" not in done.stdout
    assert done.stderr == ""


def test_sigterm_before_the_report_writes_it_from_the_handler(tmp_path):
    done, lines = _run(tmp_path, "before")
    assert lines == [{"part": 1, "exit_code": 143}, {"part": 2}]
    assert done.returncode == 143
    assert "not reached" not in done.stdout
