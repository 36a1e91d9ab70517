"""Log lines for people (text, the default) or for machines (FLIPGATE_LOG_FORMAT=json: one
JSON object per line), from the API, the worker and the sweeper, each with the request id of
the work under way.

No secret reaches a line: the server never logs a header, a body, a query string or a URL
with its password (the access line has the method, the route and the path; the database URL
is logged masked), and `redacted` masks any `scheme://user:password@` left in a message."""

import json
import logging
import re
import sys
from datetime import UTC, datetime

from service.observability.context import current_request_id

TEXT_FORMAT = "%(asctime)s %(levelname)s [%(process_name)s] %(name)s: %(message)s%(request_tag)s"
# reserved LogRecord attributes: what is left of a record's __dict__ are its `extra` fields
_RESERVED = set(logging.makeLogRecord({}).__dict__) | {
    "message", "asctime", "process_name", "request_id", "request_tag", "color_message"}
# their INFO lines hold whole URLs (a callback's may carry a token in its query)
QUIET_LOGGERS = ("httpx", "httpcore")
URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:@/\s]*):[^@/\s]+@",
                          re.I)


def redacted(text: str) -> str:
    """`text` with the password of every URL in it masked."""
    if "://" not in text:  # no URL (the access lines): no pattern to run
        return text
    return URL_PASSWORD.sub(r"\g<scheme>\g<user>:***@", text)


class Context(logging.Filter):
    """Adds the process's role and the request id under way to every record."""

    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def filter(self, record: logging.LogRecord) -> bool:
        record.process_name = self.process_name
        record.request_id = current_request_id()
        record.request_tag = f" request_id={record.request_id}" if record.request_id else ""
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return redacted(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, process, pid, message, request_id
    (when there is one), the record's `extra` fields, and the exception's traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(
                    timespec="milliseconds"),
                "level": record.levelname.lower(), "logger": record.name,
                "process": getattr(record, "process_name", None), "pid": record.process,
                "message": redacted(record.getMessage())}
        if getattr(record, "request_id", None):
            line["request_id"] = record.request_id
        line |= {key: value for key, value in record.__dict__.items()
                 if key not in _RESERVED and not key.startswith("_")}
        if record.exc_info:
            line["exception"] = redacted(self.formatException(record.exc_info))
        return json.dumps(line, default=str)


def configure_logging(log_format: str, process_name: str, level: int = logging.INFO) -> None:
    """Send every log record of this process to stderr in `log_format` ("text" or "json"),
    tagged with `process_name` (api, worker, sweeper); replaces any handler configured
    before (Celery's, uvicorn's)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(Context(process_name))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    skip_unprinted_record_fields()
    for name in ("uvicorn", "uvicorn.error", "celery"):
        named = logging.getLogger(name)
        named.handlers.clear()
        named.propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # flipgate.access has the route
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # warnings become lines in the same format


def skip_unprinted_record_fields() -> None:
    """Stop making each record find its caller's file and line and its thread's and process's
    names, which neither format prints (the logging HOWTO's "Optimization": every access
    line paid for them)."""
    logging._srcfile = None  # type: ignore[attr-defined]  # the documented switch
    logging.logThreads = False
    logging.logMultiprocessing = False
