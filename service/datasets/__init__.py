"""Labeled data sets: eval sets that versions are compared on and training sets."""
