"""Measuring kernels against their peers: timing, FLOP counts, baselines."""
