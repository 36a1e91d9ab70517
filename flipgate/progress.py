"""The progress callbacks that long work reports through (one definition for the library),
and the command line's progress bars that receive them."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

Progress = Callable[[int, int], None]
"""Called with (done, total) as work advances."""

ProgressFactory = Callable[[str], Progress]
"""Makes one Progress per labelled phase (e.g. one progress bar each)."""


@contextmanager
def progress_bars(enabled: bool = True) -> Iterator[ProgressFactory]:
    """Progress bars on stderr when it is a terminal; yields one callback factory. Not
    `enabled`, its callbacks do nothing and rich (20 ms to import) is not loaded."""
    if not enabled:
        yield lambda _description: _ignore
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as ProgressBars

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn())
    console = Console(stderr=True)
    with ProgressBars(*columns, console=console, transient=True,
                  disable=not console.is_terminal) as progress:

        def bar(description: str) -> Progress:
            task = progress.add_task(description, total=None)
            return lambda done, total: progress.update(task, completed=done, total=total)

        yield bar


def _ignore(_done: int, _total: int) -> None:
    """The progress callback that shows nothing."""
