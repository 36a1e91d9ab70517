"""One check of every request's scalars before an endpoint sees them (an app dependency).

- An integer declared in a path or query string must fit a 32-bit signed column
  (|value| < 2^31): larger ones answer 422 `out_of_range` on every database, instead of
  overflowing a driver.
- No NUL byte anywhere in the path, the query string, JSON bodies or form fields (names,
  values and file names): 422 `nul_byte`. PostgreSQL cannot store them in text, and no name or
  message needs one.
- No query parameter or form field given twice: 422 `duplicate_field`. Every parameter of
  the API is a single value, and silently keeping the last of two names would act on a name
  the client may not have meant.
"""

import json
import types
from collections.abc import Iterator
from typing import Any, Union, get_args, get_origin

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import UploadFile

from service.errors import InvalidInput

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
NUL = "\x00"
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
_INTEGER = TypeAdapter(int)


async def check_request_scalars(request: Request) -> None:
    """Refuse out-of-range integers in the path and query, and NUL bytes anywhere."""
    _refuse_nul(request.url.path, "the path")
    query = request.query_params.multi_items()
    _refuse_duplicates(query, "query parameter")
    for key, value in query:
        _refuse_nul(key + value, f"query parameter {key!r}")
    route = request.scope["route"]
    path_ints, query_ints = integer_parameters(route)
    for name in path_ints:
        _check_range(request.path_params.get(name), f"path parameter {name!r}")
    for name in query_ints:
        for value in request.query_params.getlist(name):
            _check_range(value, f"query parameter {name!r}")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        _refuse_nul_in_json(await request.body())
    elif content_type in FORM_TYPES and _reads_a_body(route):
        fields = (await request.form()).multi_items()
        _refuse_duplicates(fields, "form field")
        for key, value in fields:
            text = (value.filename or "") if isinstance(value, UploadFile) else value
            _refuse_nul(key + text, f"form field {key!r}")


def integer_parameters(route: APIRoute) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the integer path and query parameters of a route and its dependencies."""
    path, query = [], []
    for current in _dependants(route.dependant):
        path += [field.alias for field in current.path_params if _is_integer(field)]
        query += [field.alias for field in current.query_params if _is_integer(field)]
    return tuple(path), tuple(query)


def _dependants(dependant: Dependant) -> Iterator[Dependant]:
    pending = [dependant]
    while pending:
        current = pending.pop()
        yield current
        pending += current.dependencies


def _reads_a_body(route: APIRoute) -> bool:
    return any(current.body_params for current in _dependants(route.dependant))


def _is_integer(field: Any) -> bool:
    """Whether a parameter is declared int, int | None or list[int]."""
    annotation = field.field_info.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_integer_type(arg) for arg in get_args(annotation))
    return _is_integer_type(annotation)


def _is_integer_type(annotation: Any) -> bool:
    if get_origin(annotation) in (list, tuple, set):
        return any(_is_integer_type(arg) for arg in get_args(annotation))
    return annotation is int


def _check_range(text: str | None, where: str) -> None:
    """An integer (as the API would parse it) outside the 32-bit range is refused; text that
    is no integer is left to the parameter's own validation."""
    if text is None:
        return
    try:
        value = _INTEGER.validate_python(text)
    except ValidationError:
        return
    if not INT32_MIN <= value <= INT32_MAX:
        raise InvalidInput("out_of_range", f"{where} must lie in [{INT32_MIN}, {INT32_MAX}]")


def _refuse_duplicates(items: list[tuple[str, Any]], what: str) -> None:
    seen = set()
    for key, _value in items:
        if key in seen:
            raise InvalidInput("duplicate_field", f"{what} {key!r} is given more than once")
        seen.add(key)


def _refuse_nul(text: str, where: str) -> None:
    if NUL in text:
        raise InvalidInput("nul_byte", f"{where} contains a NUL byte (\\u0000)")


def _refuse_nul_in_json(body: bytes) -> None:
    """Refuse a JSON body with a NUL byte in any key or string; bodies that are no JSON are
    left to the endpoint's own parsing."""
    if b"\\u0000" not in body.lower() and b"\x00" not in body:
        return
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return
    pending = [document]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, str):
            _refuse_nul(item, "the JSON body")
