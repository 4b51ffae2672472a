"""pdd-operator benchmarks: scale runs, the side-by-side baseline and placement quality.

Run through `bench/run.py` (`make bench`); see docs/benchmarks.md for what is measured.
"""
