"""Names that become path components (experiments, nodes, folders): one rule for settings and protocol alike.

A name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, and never a
temporary name of the storage contract (hidden, ``.tmp``, ...). So it is never '.', '..', hidden,
empty, or contains '/' or '\\'.

It must also be portable across the stores a swarm shares one folder through: lowercase (Drive for
desktop on macOS and Windows folds case, so ``W1`` and ``w1`` would be one file and two nodes would
write, and prune, each other's), not a name Windows reserves (``con``, ``prn``, ``aux``, ``nul``,
``com0``-``com9``, ``lpt0``-``lpt9``, also with an extension: ``con.json``), and not ending in a dot
(Windows drops it). Names the package makes itself, such as a reset's time stamp, may keep uppercase.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Device names Windows reserves in any case, also before an extension ("nul.json", "com1.tar.gz").
_WINDOWS_RESERVED = re.compile(r"(con|prn|aux|nul|com[0-9]|lpt[0-9])(\..*)?", re.IGNORECASE)


def is_temporary(name: str) -> bool:
    """True for names that are never a finished protocol file: hidden, editor or sync temporaries.

    Every backend writes a file under a temporary name first and lists none of them (unless asked), so a
    reader never sees a half-written file; names that look like one are refused as protocol names too.
    (Part of the storage contract, kept here on the bottom floor so that every settings module may check names.)
    """
    return name.startswith((".", "~")) or name.endswith((".tmp", ".partial", ".part"))


SAFE_FIX = "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (no '/', no '..')"


class InvalidNameError(ValueError):
    """A name that cannot become a path component."""

    def __init__(self, what: str, value: object, fix: str) -> None:
        self.what, self.value, self.fix = what, value, fix
        super().__init__(f"{what}={value!r}: {fix}")


def validate_name(value: object, what: str = "name", *, lowercase: bool = True) -> str:
    """Return ``value`` if it is a safe and portable single path component, else raise :class:`InvalidNameError`.

    Allowed: 1-64 characters of letters, digits, '.', '_' and '-', starting with a letter or
    digit (so never '.', '..', hidden, empty, or containing '/' or '\\'); lowercase unless
    ``lowercase`` is False; not reserved on Windows; not ending in '.'. The error's message names
    ``what`` (the variable), the value and the fix.
    """
    if not isinstance(value, str) or not _NAME.fullmatch(value) or is_temporary(value):
        raise InvalidNameError(what, value, SAFE_FIX)
    if lowercase and value != value.lower():
        raise InvalidNameError(
            what,
            value,
            f"use lowercase, e.g. {value.lower()!r}: Drive for desktop on macOS and Windows ignores case, so names "
            "that differ only in case would be one file shared by two nodes",
        )
    if value.endswith("."):
        raise InvalidNameError(
            what, value, f"do not end it with '.': Windows drops a trailing dot, which makes it {value.rstrip('.')!r}"
        )
    if _WINDOWS_RESERVED.fullmatch(value):
        raise InvalidNameError(
            what,
            value,
            "Windows reserves con, prn, aux, nul, com0-com9 and lpt0-lpt9 (also with an extension), so Drive for "
            f"desktop cannot sync it: choose another name, e.g. 'n-{value.lower()}'",
        )
    return value
