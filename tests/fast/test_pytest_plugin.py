"""The pytest plugin, end to end with pytester: real pytest runs of real test files that use real torch."""

import subprocess
import sys
import textwrap

import pytest

pytest_plugins = ["pytester"]

HEADLINE = "a tensor saved for backward was modified in place before backward used it"
TORCH_MESSAGE = "one of the variables needed for gradient computation has been modified by an inplace operation"

BUGGY = textwrap.dedent(
    """
    import torch

    def test_bug():
        x = torch.ones(3, requires_grad=True)
        y = torch.sigmoid(x)
        y.mul_(2)  # sigmoid saved its output for backward
        y.sum().backward()

    def test_clean():
        x = torch.ones(3, requires_grad=True)
        torch.sigmoid(x).mul(2).sum().backward()
        assert x.grad is not None
    """
)


@pytest.fixture(autouse=True, scope="module")
def _import_everything_before_inline_runs():
    """pytester's inline runs drop the modules imported during each run from ``sys.modules``; re-importing
    parts of torch in the next run crashes the process. So import, once, whatever a guarded run imports."""
    import torch

    import gradguard

    try:
        with gradguard.guard():
            x = torch.ones(2, requires_grad=True)
            y = torch.sigmoid(x)
            y.mul_(2)
            y.sum().backward()
    except gradguard.InplaceModificationError:
        pass
    from gradguard.report import text as _text  # noqa: F401


def test_plugin_module_loads_without_torch():
    code = (
        "import sys, gradguard.integrations.pytest_plugin as p\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'gradguard.backends')))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_plugin_is_registered_by_entry_point_and_stays_inert(pytester):
    pytester.makepyfile(
        """
        import sys

        def test_nothing_heavy_loaded(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("gradguard")
            assert "gradguard.integrations.pytest_plugin" in sys.modules
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_marker_is_registered(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.gradguard(fingerprint='full', track_writes=True, backend='auto', "
                                 "enabled=True): run this test under gradguard.guard(...) with these arguments; "
                                 "enabled=False opts it out of --gradguard"])


def test_option_guards_every_test_and_reports_the_finding(pytester):
    pytester.makepyfile(test_models=BUGGY)
    result = pytester.runpytest("--gradguard")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["gradguard: every test runs under gradguard.guard() (auto mode)"])
    result.stdout.fnmatch_lines(["FAILED test_models.py::test_bug - gradguard.InplaceModificationError:*"])
    # The finding as the test's report section, shown with the failure ...
    result.stdout.fnmatch_lines([
        "*- Captured gradguard call -*",
        HEADLINE,
        "  tensor      : y (float32[3], output of SigmoidBackward0)",
        "  saved by    : SigmoidBackward0.result, saved in the forward call at test_models.py:5",
        "                 | y = torch.sigmoid(x)",
        "  versions    : saved at 0, now 1",
        "  modified by :",
        "    1. aten.mul_.Tensor at test_models.py:6  (version 0 -> 1)",
        "       | y.mul_(2)  # sigmoid saved its output for backward",
    ])
    # ... and in the terminal summary.
    result.stdout.fnmatch_lines([
        "*= gradguard =*",
        f"test_models.py::test_bug: {HEADLINE}",
        "    tensor: y (float32[3], output of SigmoidBackward0)",
        "    saved by: SigmoidBackward0.result",
        "gradguard: 1 finding(s) in 1 test(s)",
    ])


def test_without_the_option_tests_run_unguarded(pytester):
    pytester.makepyfile(test_models=BUGGY)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1, passed=1)
    out = result.stdout.str()
    assert TORCH_MESSAGE in out
    assert "Captured gradguard" not in out
    assert "= gradguard =" not in out


def test_marker_guards_one_test_with_its_arguments_and_can_opt_out(pytester):
    pytester.makepyfile(
        """
        import pytest
        import torch
        import gradguard

        @pytest.mark.gradguard(fingerprint="off", track_writes=False)
        def test_marked():
            x = torch.ones(3, requires_grad=True)
            y = torch.sigmoid(x)
            y.mul_(2)
            with pytest.raises(gradguard.InplaceModificationError) as info:
                y.sum().backward()
            assert "write tracking was off" in info.value.finding.notes[0]

        @pytest.mark.gradguard(enabled=False)
        def test_opted_out():
            x = torch.ones(3, requires_grad=True)
            y = torch.sigmoid(x)
            y.mul_(2)
            with pytest.raises(RuntimeError) as info:
                y.sum().backward()
            assert not isinstance(info.value, gradguard.GradguardError)
        """
    )
    result = pytester.runpytest("--gradguard", "--strict-markers")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["test_marker_guards_one_test_with_its_arguments_and_can_opt_out.py::test_marked: "
                                 f"{HEADLINE}", "gradguard: 1 finding(s) in 1 test(s)"])


def test_marker_with_a_wrong_argument_is_a_usage_error(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gradguard(fingerprints="full")
        def test_typo():
            pass
        """
    )
    result = pytester.runpytest()
    assert result.ret != 0
    result.stderr.fnmatch_lines([
        "ERROR: test_marker_with_a_wrong_argument_is_a_usage_error.py::test_typo: @pytest.mark.gradguard got "
        "unknown argument(s) fingerprints; it takes fingerprint, track_writes, backend, enabled"
    ])


def test_fixture_runs_the_test_under_the_guard_and_exposes_findings(pytester):
    pytester.makepyfile(
        """
        import pytest
        import torch
        import gradguard

        def test_with_fixture(gradguard):
            x = torch.ones(3, requires_grad=True)
            y = torch.sigmoid(x)
            assert gradguard.findings == []
            y.mul_(2)
            with pytest.raises(RuntimeError) as info:
                y.sum().backward()
            assert type(info.value).__name__ == "InplaceModificationError"
            assert [f.tensor.label for f in gradguard.findings] == ["y (float32[3], output of SigmoidBackward0)"]
            assert gradguard.findings[0].saved_at.op == "SigmoidBackward0.result"
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["gradguard: 1 finding(s) in 1 test(s)"])


def test_silent_write_fails_the_test_under_the_option(pytester):
    pytester.makepyfile(
        """
        import torch

        def test_data_write():
            w = torch.ones(3, requires_grad=True)
            x = torch.ones(3, requires_grad=True)
            y = x * w  # MulBackward0 saves w
            w.data.mul_(3)
            y.sum().backward()
        """
    )
    result = pytester.runpytest("--gradguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*SilentModificationError*",
        "*a tensor saved for backward changed without its version counter moving: gradients would be silently wrong",
    ])


def test_sentinel_first_then_a_forensic_rerun_names_the_writer(pytester):
    pytester.makepyfile(test_models=BUGGY)
    result = pytester.runpytest("--gradguard")
    result.assert_outcomes(failed=1, passed=1)
    # The sentinel failed the test; the forensic re-run of its body named the line that wrote, and says so.
    result.stdout.fnmatch_lines([
        "    1. aten.mul_.Tensor at test_models.py:6  (version 0 -> 1)",
        "*the write was found by running this test again in forensic mode*",
    ])
    sentinel = pytester.runpytest("--gradguard", "--gradguard-mode=sentinel")
    sentinel.assert_outcomes(failed=1, passed=1)
    sentinel.stdout.fnmatch_lines(["gradguard: every test runs under gradguard.guard() (sentinel mode)"])
    sentinel.stdout.fnmatch_lines(["  modified by : not recorded (write log off)"])
    assert "running this test again" not in sentinel.stdout.str()


def test_a_rerun_that_does_not_reproduce_keeps_the_sentinels_finding(pytester):
    pytester.makepyfile(
        """
        import torch

        RUNS = []

        def test_only_fails_once():
            RUNS.append(1)
            x = torch.ones(3, requires_grad=True)
            y = torch.sigmoid(x)
            if len(RUNS) == 1:
                y.mul_(2)
            y.sum().backward()
        """
    )
    result = pytester.runpytest("--gradguard")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "saved by    : SigmoidBackward0.result" in out
    assert "1. aten.mul_" not in out  # the sentinel saw no write; the re-run did not fail: nothing invented
    assert "running this test again" not in out


def test_the_plugin_and_gradguard_fix_name_the_same_report_variable():
    # the plugin spells the name out (it loads without the library); gradguard fix sets it for verification runs
    from gradguard.fix.pytest_run import FIX_PYTEST_REPORT_ENV
    from gradguard.integrations import pytest_plugin

    assert pytest_plugin._FIX_REPORT_ENV == FIX_PYTEST_REPORT_ENV == "GRADGUARD_FIX_PYTEST_REPORT"
