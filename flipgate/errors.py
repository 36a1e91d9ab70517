"""Errors the library raises for input a user got wrong."""


class InputError(ValueError):
    """Input that flipgate refuses; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
