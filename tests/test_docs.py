"""The README and docs/ as a newcomer walks them: every relative link reaches a file (and a
heading) and every repository file they name exists, the README's test command is the one CI
runs, the tour's commands are the CLI's, every subcommand has a row in docs/cli.md, and the
test suite's -m filters name declared markers."""

import argparse
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from flipgate.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# a file (name.ext) or folder (name/) of the repository, named in text or code
REPOSITORY_PATH = re.compile(r"(?<![\w/.<])((?:tests|benchmarks|service|worker|flipgate|scripts|"
                             r"migrations|docs)/[\w/.-]*(?:\.\w+|/))")


def prose(page: Path) -> str:
    """The page without its fenced code blocks (a `](x)` inside code is not a link)."""
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def code_blocks(text: str) -> list[str]:
    """The contents of every fenced code block of `text`, in order."""
    return [block.split("\n", 1)[1].rsplit("```", 1)[0] for block in FENCE.findall(text)]


def section(page: Path, heading: str) -> str:
    """The text of the `## heading` section of `page`, up to the next `## ` heading."""
    text = page.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on `page`, repeated headings numbered as GitHub does."""
    found: set[str] = set()
    for line in prose(page).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            base = name = slug(match.group(1))
            number = 0
            while name in found:
                number += 1
                name = f"{base}-{number}"
            found.add(name)
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of `page` whose file, or whose heading in a .md file, is missing."""
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading in {linked.relative_to(ROOT)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_file_the_page_names_exists(page):
    named = set(REPOSITORY_PATH.findall(page.read_text(encoding="utf-8")))
    assert sorted(path for path in named if not (ROOT / path).exists()) == []


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / target.partition("#")[0]).resolve()
              for target in LINK.findall(prose(ROOT / "README.md"))}
    assert [page.name for page in PAGES[1:] if page not in linked] == []


def test_ci_runs_the_readme_test_command_and_the_two_commands_come_first():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_section = re.search(r"^## (.+)$", readme, re.M).group(1)
    two_commands = code_blocks(section(ROOT / "README.md", "Two commands"))[0]
    ci = re.search(r"^exec (.+)$", (ROOT / ".ci" / "run").read_text(), re.M).group(1)
    commands = [line.split("#")[0].strip() for line in two_commands.splitlines()]
    assert first_section == "Two commands"
    assert commands == ["python3 scripts/dev.py demo", ci]


def tour_commands() -> list[list[str]]:
    """The arguments of every `flipgate` command in the README's five-minute tour."""
    tour = code_blocks(section(ROOT / "README.md", "A five-minute tour"))[0]
    calls = re.findall(r"(?:^|\$\()flipgate ([^)#&\n]+)", tour, re.M)
    return [shlex.split(call) for call in calls]


def test_the_tour_walks_the_demo_with_the_clis_own_commands():
    commands = tour_commands()
    assert {words[0] for words in commands} >= {"compare", "repair", "serve", "token",
                                                 "upload", "gate"}
    for words in commands:
        build_parser(words).parse_args(words)  # exits 2 on an unknown command or option


def subcommands() -> list[str]:
    """Every subcommand `flipgate --help` lists, the server's included."""
    parser = build_parser(["--help"])
    action = next(action for action in parser._actions
                  if isinstance(action, argparse._SubParsersAction))
    return sorted(action.choices)


def test_every_subcommand_has_a_row_in_the_cli_page():
    rows = [line for line in (ROOT / "docs" / "cli.md").read_text().splitlines()
            if line.startswith("| `flipgate ")]
    assert [name for name in subcommands()
            if not any(f"`flipgate {name}" in row for row in rows)] == []


def test_the_test_suites_filters_name_declared_markers():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    declared = {marker.split(":")[0] for marker in options["ini_options"]["markers"]}
    filters = re.findall(r"-m ['\"]([^'\"]+)['\"]", (ROOT / "docs" / "development.md").read_text())
    named = {word for words in filters for word in re.findall(r"\w+", words)} - {"not", "and", "or"}
    assert filters and named <= declared, (named, declared)
