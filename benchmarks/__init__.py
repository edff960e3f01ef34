"""Benchmarks of the registry against its floors and peers (issue 6); not part of the test suite.

Run ``make bench`` (or ``python -m benchmarks [--quick]`` from the repository root). Every figure
is a ratio measured in the same run as its floor or peer, because absolute times drift on shared
machines. Results go to ``benchmarks/results.md``; scratch files live in ``benchmarks/.work/``.
"""
