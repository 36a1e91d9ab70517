"""`flipgate upload logits|evalset|model`: send a file to a server by the fast path, as the
raw body of a PUT (no multipart form to build or parse)."""

import argparse
import hashlib
import http.client
import json
import os
import socket
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote, urlencode, urlsplit

from flipgate.commands import add_server_flags, server_credentials
from flipgate.errors import InputError
from flipgate.gate_client import Credentials, answer, http_client, json_answer
from flipgate.progress import Progress, progress_bars

CHUNK_BYTES = 1 << 20  # read and sent at a time (os.sendfile measured slower here)
# the body's sha256, which the server checks: a bucket then takes the body at its address
# (no staging copy), and a body changed on the way is refused (422 digest_mismatch)
DIGEST_HEADER = "X-Flipgate-Sha256"
# on the server's /healthz: a declared digest saves its store a copy (an S3 bucket), so the
# client hashes the file first; elsewhere it sends the body at once
DIGEST_WANTED_HEADER = "X-Flipgate-Sha256-Wanted"
READ_SECONDS, WRITE_SECONDS = 60.0, 300.0  # per read / per write of a chunk, not in all
CONNECTIONS = {"http": http.client.HTTPConnection, "https": http.client.HTTPSConnection}
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


def put_file(server: str, url: str, path: Path, *, params: dict[str, str],
             credentials: Credentials, progress: Progress | None = None) -> dict:
    """PUT the file `path` as the raw body of `url` (with query `params`, and its sha256
    declared in DIGEST_HEADER when the server wants it) on `server`; the server's JSON
    answer. The body is sized
    (Content-Length, never chunked) and goes out on a connection of the standard library,
    CHUNK_BYTES at a time (no HTTP client to import, no copy per chunk); through an HTTP proxy
    (HTTP_PROXY / HTTPS_PROXY) it goes by httpx."""
    params = {**params, **credentials.params()}
    address = f"{server.rstrip('/')}{url}" + (f"?{urlencode(params)}" if params else "")
    headers = {"Content-Type": "application/octet-stream",
               "Content-Length": str(path.stat().st_size), **credentials.headers()}
    with path.open("rb") as file:
        if wants_digest(server):
            headers[DIGEST_HEADER] = hashlib.file_digest(file, "sha256").hexdigest()
            file.seek(0)
        try:
            if _proxied(address):
                return _put_by_httpx(server, url, file, params, headers, progress)
            return _put_direct(address, file, headers, progress)
        except TRANSPORT_ERRORS as error:
            raise InputError("unreachable", f"cannot reach {server}: "
                               f"{error or type(error).__name__}") from error


def wants_digest(server: str) -> bool:
    """Whether the server's /healthz says a declared digest saves it a copy (False when it
    cannot be asked: the upload then reports what is wrong)."""
    try:
        with urllib.request.urlopen(f"{server.rstrip('/')}/healthz",
                                    timeout=READ_SECONDS) as answer:
            return answer.headers.get(DIGEST_WANTED_HEADER) == "1"
    except (OSError, ValueError):
        return False


def _put_direct(address: str, file: BinaryIO, headers: dict[str, str],
                     progress: Progress | None) -> dict:
    """The PUT on a connection of the standard library."""
    parts = urlsplit(address)
    if parts.scheme not in CONNECTIONS or not parts.hostname:
        raise InputError("invalid_server", f"{address}: the server must be an http(s) URL")
    connection = CONNECTIONS[parts.scheme](parts.netloc, timeout=WRITE_SECONDS)
    try:
        connection.putrequest("PUT", parts.path + (f"?{parts.query}" if parts.query else ""),
                              skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        # a server that refuses early closes the connection: its answer is read all the same
        with suppress(BrokenPipeError, ConnectionResetError):
            _send(connection.sock, file, progress)
        connection.sock.settimeout(READ_SECONDS)
        response = connection.getresponse()
        return json_answer(response.status, response.read(), response.reason, address)
    finally:
        connection.close()


def _send(sock: socket.socket, file: BinaryIO, progress: Progress | None) -> None:
    """The whole file on `sock`, CHUNK_BYTES at a time through one reused buffer, reporting
    the bytes sent."""
    total, sent = os.fstat(file.fileno()).st_size, 0
    buffer = memoryview(bytearray(CHUNK_BYTES))
    while read := file.readinto(buffer):
        sock.sendall(buffer[:read])
        sent += read
        if progress:
            progress(sent, total)


def _proxied(address: str) -> bool:
    """Whether the environment sends requests to `address` through a proxy."""
    parts = urlsplit(address)
    return parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(
        parts.hostname or "")


def file_chunks(file: BinaryIO, progress: Progress | None) -> Iterator[bytes]:
    """The file CHUNK_BYTES at a time, reporting the bytes sent."""
    total, sent = os.fstat(file.fileno()).st_size, 0
    while chunk := file.read(CHUNK_BYTES):
        sent += len(chunk)
        yield chunk
        if progress:
            progress(sent, total)


def _put_by_httpx(server: str, url: str, file: BinaryIO, params: dict[str, str],
                  headers: dict[str, str], progress: Progress | None) -> dict:
    """The PUT through httpx, which honours the proxy settings of the environment (the
    declared Content-Length keeps the body unchunked)."""
    import httpx

    with http_client(server, httpx.Timeout(READ_SECONDS, write=WRITE_SECONDS)) as http:
        try:
            response = http.put(url, params=params, content=file_chunks(file, progress),
                                headers=headers)
        except httpx.TransportError as error:
            raise OSError(str(error) or type(error).__name__) from error
    return answer(response)


def version_url(reference: str) -> str:
    """The URL path of the version `line:version`."""
    line, _, version = reference.partition(":")
    if not line or not version:
        raise InputError("invalid_reference", f"{reference!r}: name a version as LINE:VERSION")
    return f"/models/{quote(line, safe='')}/versions/{quote(version, safe='')}"


Request = tuple[str, dict[str, str], Callable[[dict], str]]  # URL, query, summary of the answer


def logits_request(args: argparse.Namespace) -> Request:
    """PUT /models/{line}/versions/{version}/predictions?evalset=E&scores=S."""
    return (f"{version_url(args.version)}/predictions",
            {"evalset": args.evalset, "scores": args.scores},
            lambda record: f"stored {args.version} on {args.evalset}: logits "
                           f"{record.get('logits_sha256')}")


def evalset_request(args: argparse.Namespace) -> Request:
    """PUT /evalsets/{name}."""
    return (f"/evalsets/{quote(args.name, safe='')}", {},
            lambda record: evalset_summary(args.name, record))


def evalset_summary(name: str, record: dict) -> str:
    """What the server registered: a labeled eval set and its classes, or a traffic set (and
    its classes when it names them)."""
    classes = record.get("num_classes")
    if record.get("labeled", True):
        return f"registered eval set {name}: {record.get('n')} samples, {classes} classes"
    named = "" if classes is None else f", {classes} classes"
    return f"registered traffic set {name}: {record.get('n')} samples{named}, no labels yet"


def model_request(args: argparse.Namespace) -> Request:
    """PUT /models/{line}/versions/{version}?parent=&metadata=&output=&scores=."""
    fields = {"parent": args.parent, "metadata": args.metadata, "output": args.output,
              "scores": args.scores}
    return (version_url(args.version),
            {name: value for name, value in fields.items() if value is not None},
            lambda record: f"registered {args.version}: artifact "
                           f"{record.get('artifact_sha256')}")


def run_upload(args: argparse.Namespace) -> int:
    """Upload and print the server's record; exit 0, or 2 on a usage or HTTP error."""
    if not args.file.is_file():
        raise InputError("file_not_found", f"{args.file} is not a file")
    url, params, summary = args.request(args)
    credentials = server_credentials(args)
    with progress_bars(enabled=sys.stderr.isatty()) as bars:  # no bars, no rich to import
        record = put_file(args.server, url, args.file, params=params, credentials=credentials,
                          progress=bars(f"uploading {args.file.name}"))
    print(json.dumps(record) if args.json else summary(record))
    return 0


def add_upload_command(commands: argparse._SubParsersAction) -> None:
    """The `flipgate upload` subcommand and its `logits`, `evalset` and `model`."""
    upload = commands.add_parser("upload", help="send files to a server by the fast path")
    kinds = upload.add_subparsers(dest="kind", required=True, parser_class=type(upload))
    logits = _kind(kinds, "logits", "a version's logits (or probabilities) on an eval set",
                   "/models/{line}/versions/{version}/predictions", logits_request)
    logits.add_argument("version", metavar="LINE:VERSION")
    logits.add_argument("file", type=Path, metavar="FILE.npy", help="(N, C) float scores")
    logits.add_argument("--evalset", required=True, help="the eval set they score")
    logits.add_argument("--scores", choices=("logits", "probabilities"), default="logits",
                        help="what the file holds (probabilities are stored as their logs)")
    evalset = _kind(kinds, "evalset", "register an eval set (.npz; without `y`, a traffic "
                    "set whose labels come later)", "/evalsets/{name}", evalset_request)
    evalset.add_argument("name", metavar="NAME")
    evalset.add_argument("file", type=Path, metavar="FILE.npz",
                         help="named arrays: the inputs (x, or one per model input) and y "
                              "(none for a traffic set)")
    model = _kind(kinds, "model", "register an ONNX version (.onnx, or .zip with its "
                  "external data)", "/models/{line}/versions/{version}", model_request)
    model.add_argument("version", metavar="LINE:VERSION")
    model.add_argument("file", type=Path, metavar="FILE.onnx|FILE.zip")
    model.add_argument("--parent", help="the version it replaces: VERSION (of the same line), "
                                        "LINE:VERSION or LINE@ALIAS")
    model.add_argument("--metadata", metavar="JSON", help="a JSON object kept with the version")
    model.add_argument("--output", help="the output that holds the scores (default: chosen "
                                        "from the graph)")
    model.add_argument("--scores", choices=("logits", "probabilities"),
                       help="what the scores are (default: detected from the graph)")


def _kind(kinds: argparse._SubParsersAction, name: str, summary: str, url: str,
          request: Callable[[argparse.Namespace], Request]) -> argparse.ArgumentParser:
    """One kind of upload, with the options every kind shares."""
    parser = kinds.add_parser(name, help=summary, description=f"{summary}: PUTs the file as "
                              f"the raw request body of {url}, streamed, no multipart form. "
                              "Exit 0, or 2 on a usage or HTTP error.")
    add_server_flags(parser, token_needs="scope write")
    parser.add_argument("--json", action="store_true", help="print the server's JSON answer")
    parser.set_defaults(run=run_upload, request=request)
    return parser
