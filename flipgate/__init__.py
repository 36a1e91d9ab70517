"""flipgate: a regression gate for classifier updates."""

__version__ = "0.1.0"
