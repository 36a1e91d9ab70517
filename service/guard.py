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
import weakref
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.openapi.utils import get_openapi
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
    _refuse_nul(request.scope["path"], "the path")
    query = request.query_params.multi_items()
    _refuse_duplicates(query, "query parameter")
    for key, value in query:
        _refuse_nul(key + value, f"query parameter {key!r}")
    route = _declared(request.scope["route"])
    for name in route.path_integers:
        _check_range(request.path_params.get(name), f"path parameter {name!r}")
    for name in route.query_integers:
        for value in request.query_params.getlist(name):
            _check_range(value, f"query parameter {name!r}")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        _refuse_nul_in_json(await request.body())
    elif content_type in FORM_TYPES and route.reads_a_body:
        fields = (await request.form()).multi_items()
        _refuse_duplicates(fields, "form field")
        for key, value in fields:
            text = (value.filename or "") if isinstance(value, UploadFile) else value
            _refuse_nul(key + text, f"form field {key!r}")


@dataclass(frozen=True)
class Declared:
    """What a route declares that the guard checks: the names of its integer path and query
    parameters (its dependencies' included), and whether FastAPI reads a body for it (JSON
    or form fields; a raw body that an endpoint streams itself is no such body)."""

    path_integers: tuple[str, ...]
    query_integers: tuple[str, ...]
    reads_a_body: bool


_DECLARED: dict[int, Declared] = {}  # by route, derived on its first request; an entry
# leaves with its route, so no later route of the same id finds it


def _declared(route: APIRoute) -> Declared:
    """What `route` declares (cached for the route's life)."""
    key = id(route)
    if key not in _DECLARED:
        _DECLARED[key] = _from_openapi(route)
        weakref.finalize(route, _DECLARED.pop, key, None)
    return _DECLARED[key]


def _from_openapi(route: APIRoute) -> Declared:
    """Read from the OpenAPI operation FastAPI writes for the route, FastAPI's public account
    of what a route reads: the route is declared again, shown in the schema (the dashboard's
    pages are not) and without its `openapi_extra` (raw bodies document themselves there)."""
    shown = APIRoute(route.path_format, route.endpoint, methods=route.methods,
                     dependencies=route.dependencies, response_model=None)
    document = get_openapi(title="guard", version="0", routes=[shown])
    operation = next(iter(document["paths"][route.path_format].values()))  # one endpoint:
    parameters = operation.get("parameters", [])  # the same for each of its methods
    return Declared(
        path_integers=_integers(parameters, "path"),
        query_integers=_integers(parameters, "query"),
        reads_a_body="requestBody" in operation)


def _integers(parameters: list[dict[str, Any]], where: str) -> tuple[str, ...]:
    return tuple(parameter["name"] for parameter in parameters
                 if parameter["in"] == where and _is_integer(parameter["schema"]))


def _is_integer(schema: dict[str, Any]) -> bool:
    """Whether a parameter's JSON schema admits an integer, or a list of them (int,
    int | None, list[int])."""
    if schema.get("type") == "array":
        return _is_integer(schema.get("items", {}))
    return schema.get("type") == "integer" or any(_is_integer(option)
                                                  for option in schema.get("anyOf", ()))


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
