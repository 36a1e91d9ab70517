"""A decision's CI context condensed to "PR #131 · 7d316b1 · run", linked by the
provider's URL conventions (GitHub's and GitLab's; other providers get plain text)."""

import re
from typing import Any

PULL_REF = re.compile(r"refs/(?:pull|merge-requests)/(\d+)/")
HOSTS = {"github": ("https://github.com/{repo}/pull/{number}", "https://github.com/{repo}/commit/{sha}"),
         "gitlab": ("https://gitlab.com/{repo}/-/merge_requests/{number}",
                    "https://gitlab.com/{repo}/-/commit/{sha}")}


def ci_links(ci: dict[str, Any] | None) -> list[tuple[str, str | None]]:
    """(text, link or None) for the pull request, the commit and the run."""
    if not ci:
        return []
    pull_url, commit_url = HOSTS.get(str(ci.get("provider") or "github").lower(), (None, None))
    repo, sha, ref, run = (ci.get(key) for key in ("repo", "sha", "ref", "run_url"))
    links: list[tuple[str, str | None]] = []
    if ref and (pull := PULL_REF.match(ref)):
        number = pull.group(1)
        links.append((f"PR #{number}", _link(pull_url, repo, number=number)))
    elif ref:
        links.append((ref.removeprefix("refs/heads/"), None))
    if sha:
        links.append((sha[:7], _link(commit_url, repo, sha=sha)))
    if run and str(run).startswith(("https://", "http://")):
        links.append(("run", run))
    return links


def _link(template: str | None, repo: str | None, **values: str) -> str | None:
    """`template` filled in, or None without a template or a repository."""
    return template.format(repo=repo, **values) if template and repo else None
