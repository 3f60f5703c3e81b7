"""Tests that compare measurements (throughput of two configs): they run after the
parallel phase, with the machine to themselves (scripts/test.sh)."""
