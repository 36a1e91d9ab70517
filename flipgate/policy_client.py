"""`flipgate policy dry-run`: replay a draft policy on a line's past decisions, on a server."""

import argparse
import json
from pathlib import Path
from urllib.parse import quote

from flipgate.commands import add_server_flags, server_credentials
from flipgate.errors import InputError
from flipgate.gate_client import (
    REQUEST_TIMEOUT_SECONDS,
    Credentials,
    GateClient,
    http_client,
)


def read_policy(path: Path) -> dict:
    """The draft policy: a JSON object in a file."""
    try:
        policy = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise InputError("invalid_policy", f"cannot read a JSON policy from {path}: "
                           f"{error}") from error
    if not isinstance(policy, dict):
        raise InputError("invalid_policy", f"{path} must hold a JSON object of policy limits")
    return policy


def dry_run(server: str, model: str, policy: dict, credentials: Credentials) -> dict:
    """The server's replay of `policy` on the line's past decisions."""
    with http_client(server, REQUEST_TIMEOUT_SECONDS) as http:
        client = GateClient(http, credentials)
        return client.post_json(f"/models/{quote(model, safe='')}/policy/dry-run", policy)


def describe(result: dict) -> list[str]:
    """The replay in lines: how many decisions, then each verdict that would change."""
    changed = result.get("changed", [])
    lines = [f"{result.get('model')}: {result.get('replayed')} past decisions replayed, "
             f"{len(changed)} of them would change verdict"]
    for change in changed:
        lines.append(f"decision {change['decision_id']} ({change['baseline']} → "
                     f"{change['candidate']}): {change['old_verdict']} → "
                     f"{change['new_verdict']}")
        lines.extend(f"  - {reason['message']}" for reason in change["reasons"])
    return lines


def run_dry_run(args: argparse.Namespace) -> int:
    """Print what the draft policy would change; exit 0 whatever it finds."""
    result = dry_run(args.server, args.model, read_policy(args.policy),
                     server_credentials(args))
    print(json.dumps(result) if args.json else "\n".join(describe(result)))
    return 0


def add_policy_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate policy` subcommand and its `dry-run`."""
    policy = commands.add_parser("policy", help="work with a line's gate policy on a server")
    actions = policy.add_subparsers(dest="action", required=True, parser_class=type(policy))
    draft = actions.add_parser(
        "dry-run", help="replay a draft policy on the line's past decisions",
        description="POSTs /models/{model}/policy/dry-run: which past verdicts the draft "
                    "would change (nothing is stored). Exit 0, or 2 on a usage or HTTP error.")
    add_server_flags(draft, token_needs="scope read")
    draft.add_argument("--model", required=True, help="the model line")
    draft.add_argument("--policy", required=True, type=Path, metavar="FILE.json",
                       help="the draft policy, as PUT /models/{model}/policy takes it")
    draft.add_argument("--json", action="store_true", help="print the server's JSON answer")
    draft.set_defaults(run=run_dry_run)
