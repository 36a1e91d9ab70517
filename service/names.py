"""What the names of lines, versions, aliases, data sets and tokens may contain.

Names never hold ':' or '@', so that "line:version" and "line@alias" parse unambiguously.
"""

import re

from service.errors import InvalidInput

NAME_LENGTH = 100
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def check_name(value: str, what: str, pattern: re.Pattern[str] = NAME) -> str:
    """Return `value` if it is a valid name, else raise InvalidInput."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        allowed = "letters, digits and . _ -" + (" +" if pattern is VERSION else "")
        raise InvalidInput(f"invalid_{what}", f"{what} {value!r} must be 1 to {NAME_LENGTH} "
                           f"characters of {allowed}, starting with a letter or digit")
    return value
