"""The machinery of settings read from environment variables, for every layer's settings alike.

Each layer declares the settings it reads as a frozen dataclass of :func:`env_field` fields (storage,
the protocol, training; :mod:`swarm_gdrive.config` composes them); each field names its variable, documents
itself and parses its text with one of the parsers here, which raise :class:`ConfigError` with a one-line
message that names the variable, the value and the fix. This module sits on the bottom floor, so that
storage may declare its settings too: it imports nothing of the package but :mod:`swarm_gdrive.names`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm_gdrive.names import InvalidNameError, validate_name

#: The texts a boolean variable accepts (case-insensitive, stripped); unset or empty is false.
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


class ConfigError(ValueError):
    """A bad environment variable: the message names the variable, the value and the fix."""

    def __init__(self, var: str, value: object, fix: str) -> None:
        self.var, self.value, self.fix = var, value, fix
        shown = "<unset>" if value is None else repr(value)
        super().__init__(f"{var}={shown}: {fix}")


def env_field(
    var: str, default: Any, help: str, parse: Callable[[str, str], Any] | None = None, secret: bool = False
) -> Any:
    """A settings field read from ``var``: its default, its documentation (docs/settings.md), the parser of its
    text, and whether it is a secret (never in a repr, shown only as set or unset)."""
    meta = {"env": var, "help": help, "parse": parse, "secret": secret}
    return field(default=default, metadata=meta, repr=not secret)


@dataclass(frozen=True)
class EnvSettings:
    """Base of every layer's settings: what all of them show the same way."""

    def describe(self) -> dict[str, Any]:
        """Every field with its value, secrets shown only as set/unset (safe to log)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["secret"]:
                value = "<set>" if value else "<unset>"
            out[f.metadata["env"]] = value
        return out


def parse_int(minimum: int, maximum: int | None = None) -> Callable[[str, str], int]:
    allowed = f"use a whole number >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")

    def parse(var: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(var, raw, allowed) from None
        if value < minimum or (maximum is not None and value > maximum):
            raise ConfigError(var, raw, allowed)
        return value

    return parse


def parse_seconds(var: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(var, raw, "use a number of seconds > 0, for example 30 or 0.5") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(var, raw, "use a number of seconds > 0, for example 30 or 0.5")
    return value


def parse_float(minimum: float, maximum: float = float("inf")) -> Callable[[str, str], float]:
    def parse(var: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(var, raw, f"use a number in [{minimum:g}, {maximum:g}]") from None
        if not minimum <= value <= maximum or not math.isfinite(value):
            raise ConfigError(var, raw, f"use a number in [{minimum:g}, {maximum:g}]")
        return value

    return parse


def parse_bool(var: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise ConfigError(var, raw, "use true or false (also 1/0, yes/no, on/off)")


def parse_choice(choices: tuple[str, ...], lower: bool = True) -> Callable[[str, str], str]:
    def parse(var: str, raw: str) -> str:
        value = raw.strip().lower() if lower else raw.strip().upper()
        if value not in choices:
            raise ConfigError(var, raw, "use one of " + ", ".join(choices))
        return value

    return parse


def parse_name(var: str, raw: str) -> str:
    try:
        return validate_name(raw.strip(), what=var)
    except InvalidNameError as err:
        raise ConfigError(var, raw, err.fix) from None


def parse_optional_name(var: str, raw: str) -> str | None:
    return parse_name(var, raw) if raw.strip() else None


def parse_text(var: str, raw: str) -> str:
    value = raw.strip()
    if not value:
        raise ConfigError(var, raw, "set a non-empty value or unset the variable")
    return value


def parse_optional_text(var: str, raw: str) -> str | None:
    return raw.strip() or None


def parse_json_text(var: str, raw: str) -> str | None:
    """Canonical JSON text (sorted keys, no spaces), so that spacing does not change a fingerprint."""
    if not raw.strip():
        return None
    try:
        return json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"))
    except json.JSONDecodeError as exc:
        raise ConfigError(var, raw, f"not JSON ({exc.msg} at column {exc.colno}): write a JSON object") from None


def parse_local_dir(var: str, raw: str) -> str:
    return str(Path(parse_text(var, raw)).expanduser())
