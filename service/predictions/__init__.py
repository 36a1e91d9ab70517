"""Logits of a model version on a data set, computed by a worker or uploaded."""
