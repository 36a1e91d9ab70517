"""Pair metrics of (old, new, data set) triples and the pairwise matrices of a line."""
