"""Robustness suite (issue 11): programs gradguard did not write, run plainly and under gradguard, compared on
exit code, output and gradients. Each class of breakage users met has a test here."""
