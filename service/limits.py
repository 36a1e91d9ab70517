"""A limit on the size of request bodies, enforced while they are read."""

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RequestBodyLimit:
    """ASGI middleware that stops reading a body past `max_bytes` with a 413 HTTPException.

    The exception is raised inside the endpoint's body parsing, so the app's own handler
    renders it (FastAPI's max_body_size would answer in plain text instead).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("content-length", "")
        declared, received = (int(header) if header.isdigit() else 0), 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if max(declared, received) > self.max_bytes:
                raise HTTPException(413, f"the request body is larger than the limit of "
                                         f"{self.max_bytes} bytes")
            return message

        await self.app(scope, limited_receive, send)
