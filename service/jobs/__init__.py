"""Background jobs (inference, metrics, training) and their progress."""
