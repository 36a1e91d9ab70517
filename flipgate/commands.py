"""What the `flipgate` command shares with the subcommands other packages contribute.

A package adds subcommands through the entry-point group COMMAND_GROUP: each entry point
names a function `add(commands)` that receives the subparsers action of `flipgate`, adds one
subcommand with `commands.add_parser(NAME, ...)` and sets its `run(args) -> exit code` with
`set_defaults(run=...)`. The entry point's name is the subcommand's name. A run that raises
flipgate.errors.InputError prints its message and exits 2, like the library's own commands.
"""

import argparse
import os

from flipgate.errors import InputError
from flipgate.gate_client import Credentials

COMMAND_GROUP = "flipgate.commands"
TOKEN_ENV, PROJECT_ENV = "FLIPGATE_TOKEN", "FLIPGATE_PROJECT"


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit code 2."""

    hint = ""  # appended to usage errors, e.g. why a subcommand is missing

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}{self.hint} (see {self.prog} --help)\n")


def add_wait_flags(parser: argparse.ArgumentParser) -> None:
    """--timeout, --poll and --json of the commands that wait for the gate's verdict."""
    parser.add_argument("--timeout", type=float, default=1800, metavar="SECONDS",
                        help="stop waiting for a pending decision after this long "
                             "(default 1800; exit 3)")
    parser.add_argument("--poll", type=float, default=2, metavar="SECONDS",
                        help="time between polls of a pending decision (default 2)")
    parser.add_argument("--json", action="store_true", help="print the final decision's JSON")


def add_server_flags(parser: argparse.ArgumentParser, *, token_needs: str) -> None:
    """--server, --token and --project of every command that calls a server (docs/access.md);
    `token_needs` says which scopes, e.g. "scope gate"."""
    parser.add_argument("--server", required=True, metavar="URL", help="e.g. http://flipgate:8000")
    parser.add_argument("--token", help=f"bearer token with {token_needs} (default: "
                        f"${TOKEN_ENV})")
    parser.add_argument("--project", help=f"the project to act in (default: ${PROJECT_ENV}); "
                        "a project-bound token needs none, the server admin's default is "
                        "`default`")


def server_credentials(args: argparse.Namespace, *, secret: str | None = None) -> Credentials:
    """Who calls the server, from add_server_flags' options: --token (or $FLIPGATE_TOKEN),
    --project (or $FLIPGATE_PROJECT), and a line's webhook `secret` where one is given."""
    return Credentials(token=args.token or os.environ.get(TOKEN_ENV), secret=secret,
                       project=args.project or os.environ.get(PROJECT_ENV) or None)


def check_wait_flags(args: argparse.Namespace) -> None:
    """Refuse a negative --timeout or a --poll that is not positive."""
    if args.timeout < 0 or args.poll <= 0:
        raise InputError("invalid_option", "--timeout must be >= 0 and --poll > 0 seconds")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]
