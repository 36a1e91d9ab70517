"""The addresses of the API's resources and the dashboard's pages: the one place a route's
path is written outside its router (tests/service/test_urls.py checks each against the app's
routes). Paths start at the server's root; `on` puts one under a base URL."""

from urllib.parse import quote, urlencode


def on(base_url: str, path: str) -> str:
    """`path` under `base_url` (which ends with "/")."""
    return base_url + path.removeprefix("/")


def job(job_id: int) -> str:
    """A job's state, progress and result."""
    return f"/jobs/{job_id}"


def version(line: str, name: str) -> str:
    """A model version."""
    return f"/models/{line}/versions/{name}"


def predictions(line: str, name: str) -> str:
    """Where a version's predictions are uploaded."""
    return f"{version(line, name)}/predictions"


def matrix(line: str, evalset: str) -> str:
    """A line's matrix of pair metrics on an eval set."""
    return f"/models/{line}/matrix?evalset={evalset}"


def compare(old: str, new: str, evalset: str, *, html: bool = False) -> str:
    """The report of the pair old → new ("line:version" each) on an eval set."""
    return f"/compare/{old}/{new}?evalset={evalset}" + ("&format=html" if html else "")


def decision(decision_id: int) -> str:
    """A gate decision."""
    return f"/gate/decisions/{decision_id}"


def ui_decision(decision_id: int) -> str:
    """The dashboard's page of a decision."""
    return f"/ui/decisions/{decision_id}"


def ui_line(line: str, evalset: str | None = None) -> str:
    """The dashboard's page of a line (its matrix on `evalset`)."""
    query = f"?{urlencode({'evalset': evalset})}" if evalset else ""
    return f"/ui/lines/{quote(line, safe='')}{query}"


def ui_pair(line: str, old: str, new: str, evalset: str | None) -> str:
    """The dashboard's page of the pair old → new of a line."""
    return (f"/ui/lines/{quote(line, safe='')}/pairs/{quote(old, safe='')}/"
            f"{quote(new, safe='')}?{urlencode({'evalset': evalset or ''})}")
