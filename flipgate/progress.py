"""The progress callbacks that long work reports through (one definition for the library)."""

from collections.abc import Callable

Progress = Callable[[int, int], None]
"""Called with (done, total) as work advances."""

ProgressFactory = Callable[[str], Progress]
"""Makes one Progress per labelled phase (e.g. one progress bar each)."""
