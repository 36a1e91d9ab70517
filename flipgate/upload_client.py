"""`flipgate upload logits`: send a version's logits on an eval set to a server by the fast
path, the file as the raw body of a PUT (no multipart form to build or parse)."""

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx

from flipgate.errors import InputError
from flipgate.gate_client import Credentials, answer
from flipgate.progress import Progress, progress_bars

CHUNK_BYTES = 1 << 20
UPLOAD_TIMEOUT = httpx.Timeout(60.0, write=300.0)  # per read / per write, not in all


def file_chunks(path: Path, progress: Progress | None = None) -> Iterator[bytes]:
    """The file a megabyte at a time, reporting the bytes sent."""
    total, sent = path.stat().st_size, 0
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            sent += len(chunk)
            yield chunk
            if progress:
                progress(sent, total)


def put_logits(server: str, reference: str, evalset: str, path: Path, *,
               credentials: Credentials, scores: str = "logits",
               progress: Progress | None = None) -> dict:
    """PUT the .npy `path` as the logits (or probabilities) of `line:version` on `evalset`;
    the server's record of them."""
    line, _, version = reference.partition(":")
    if not line or not version:
        raise InputError("invalid_reference", f"{reference!r}: name a version as LINE:VERSION")
    url = f"/models/{quote(line, safe='')}/versions/{quote(version, safe='')}/predictions"
    headers = {"Content-Type": "application/octet-stream",
               "Content-Length": str(path.stat().st_size), **credentials.headers()}
    with httpx.Client(base_url=server, timeout=UPLOAD_TIMEOUT) as http:
        try:
            response = http.put(url, params={"evalset": evalset, "scores": scores},
                                content=file_chunks(path, progress), headers=headers)
        except httpx.TransportError as error:
            raise InputError("unreachable", f"cannot reach {server}: "
                               f"{error or type(error).__name__}") from error
    return answer(response)


def run_upload_logits(args: argparse.Namespace) -> int:
    """Upload and print the stored record; exit 0, or 2 on a usage or HTTP error."""
    if not args.file.is_file():
        raise InputError("file_not_found", f"{args.file} is not a file")
    credentials = Credentials(token=args.token or os.environ.get("FLIPGATE_TOKEN"))
    with progress_bars() as bars:
        record = put_logits(args.server, args.version, args.evalset, args.file,
                            credentials=credentials, scores=args.scores,
                            progress=bars(f"uploading {args.file.name}"))
    print(json.dumps(record) if args.json else
          f"stored {args.version} on {args.evalset}: logits {record.get('logits_sha256')}")
    return 0


def add_upload_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate upload` subcommand and its `logits`."""
    upload = commands.add_parser("upload", help="send files to a server by the fast path")
    kinds = upload.add_subparsers(dest="kind", required=True, parser_class=type(upload))
    logits = kinds.add_parser(
        "logits", help="a version's logits (or probabilities) on an eval set",
        description="PUTs the .npy file as the raw request body of /models/{line}/versions/"
                    "{version}/predictions: streamed, no multipart form. Exit 0, or 2 on a "
                    "usage or HTTP error.")
    logits.add_argument("version", metavar="LINE:VERSION")
    logits.add_argument("file", type=Path, metavar="FILE.npy", help="(N, C) float scores")
    logits.add_argument("--evalset", required=True, help="the eval set they score")
    logits.add_argument("--server", required=True, metavar="URL", help="e.g. http://flipgate:8000")
    logits.add_argument("--token", help="bearer token with scope write (default: "
                                        "$FLIPGATE_TOKEN)")
    logits.add_argument("--scores", choices=("logits", "probabilities"), default="logits",
                        help="what the file holds (probabilities are stored as their logs)")
    logits.add_argument("--json", action="store_true", help="print the server's JSON answer")
    logits.set_defaults(run=run_upload_logits)
