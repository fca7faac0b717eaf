"""Names that become path components (experiments, nodes, folders): one rule for settings and protocol alike.

A name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, and never a
temporary name of the storage contract (hidden, ``.tmp``, ...). So it is never '.', '..', hidden,
empty, or contains '/' or '\\'.
"""

from __future__ import annotations

import re

from swarm_gdrive.storage.base import is_temporary

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class InvalidNameError(ValueError):
    """A name that cannot become a path component."""

    def __init__(self, what: str, value: object, fix: str) -> None:
        self.what, self.value, self.fix = what, value, fix
        super().__init__(f"{what}={value!r}: {fix}")


def validate_name(value: object, what: str = "name") -> str:
    """Return ``value`` if it is a safe single path component, else raise :class:`InvalidNameError`.

    Allowed: 1-64 characters of letters, digits, '.', '_' and '-', starting with a letter or
    digit (so never '.', '..', hidden, empty, or containing '/' or '\\').
    """
    if not isinstance(value, str) or not _NAME.fullmatch(value) or is_temporary(value):
        raise InvalidNameError(
            what,
            value,
            "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (no '/', no '..')",
        )
    return value
