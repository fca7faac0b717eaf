"""The machinery of settings read from environment variables, for every layer's settings alike.

Each layer declares the settings it reads as a frozen dataclass of :func:`env_field` fields (storage,
the protocol, training; :mod:`swarm_gdrive.config` composes them); each field names its variable, documents
itself and parses its text with one of the parsers here, which raise :class:`ConfigError` with a one-line
message that names the variable, the value and the fix. pydantic-settings reads the variables: :func:`read_env`
validates a dataclass's fields through its model (:func:`settings_model`, built once from the fields), each
field's parser its validator. This module sits on the bottom floor, so that storage may declare its settings
too: it imports nothing of the package but :mod:`swarm_gdrive.names`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

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

    @classmethod
    def named(cls, var: str, value: object, message: str) -> ConfigError:
        """The error of ``var`` whose ``message`` already names the variable and its value (a lower layer's
        ValueError): said as it is, not prefixed with ``VAR=value:`` again."""
        error = cls(var, value, message)
        error.args = (message,)
        return error


def env_field(
    var: str,
    default: Any,
    help: str,
    parse: Callable[[str, str], Any] | None = None,
    secret: bool = False,
    required: str | None = None,
) -> Any:
    """A settings field read from ``var``: its default, its documentation (docs/settings.md), the parser of its
    text, whether it is a secret (never in a repr, shown only as set or unset), and for a variable that must be
    set, the fix named when it is not (:func:`read_env`; ``default`` is then only the dataclass's)."""
    meta = {"env": var, "help": help, "parse": parse, "secret": secret, "required": required}
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


class _EnvModel(BaseSettings):
    """Base of the models :func:`settings_model` builds: variable names as written, unknown variables ignored,
    defaults kept as declared (a parser reads text), and no value in pydantic's own messages."""

    model_config = SettingsConfigDict(
        case_sensitive=True, extra="ignore", validate_default=False, hide_input_in_errors=True
    )


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source over the mapping it is given: its own reads ``os.environ`` alone
    (pydantic-settings#653), and a node's environment is often built (the launcher's, the notebooks', the tests')."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls, case_sensitive=True)

    def _load_env_vars(self) -> Mapping[str, str]:
        return self._environ

    def prepare_field_value(self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool) -> Any:
        """The text as it is: each field's parser reads it (no JSON decoding, no nested variables); skipping
        pydantic-settings' analysis of each field's type also makes reading a node's 90 variables 4 times faster."""
        return value


@functools.cache
def settings_model(cls: type[EnvSettings]) -> type[BaseSettings]:
    """The pydantic-settings model of a settings dataclass, built once from its fields (declared there alone): each
    field read from its variable (its validation alias), validated by its parser, and required if it must be set."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        var, default = f.metadata["env"], PydanticUndefined if f.metadata["required"] else f.default
        fields[f.name] = (
            Annotated[hints[f.name], BeforeValidator(functools.partial(f.metadata["parse"], var))],
            Field(default, validation_alias=var),
        )
    return create_model(f"{cls.__name__}Env", __base__=_EnvModel, **fields)


def read_env(cls: type[EnvSettings], environ: Mapping[str, str]) -> dict[str, Any]:
    """The fields of ``cls`` whose variable ``environ`` sets, parsed; the others keep their default. pydantic-settings
    reads the variables and validates every field; the first error in the fields' order is raised: a parser's
    :class:`ConfigError`, or the fix of a required variable that is unset."""
    model = settings_model(cls)
    # The source over ``environ`` alone (not os.environ, no .env file, no secrets folder), given through BaseSettings'
    # _build_sources: settings_customise_sources would build the default sources first, 1 ms more on every call.
    try:
        settings = model(_build_sources=((_MappingSource(model, environ),), {}))
    except ValidationError as exc:
        error = _first_error(cls, exc)
    else:
        return {name: getattr(settings, name) for name in settings.model_fields_set}
    raise error  # raised here, not chained to the ValidationError (whose text quotes the values)


def _first_error(cls: type[EnvSettings], exc: ValidationError) -> Exception:
    first = exc.errors()[0]  # pydantic reports the fields in their order
    (var,) = first["loc"]
    if first["type"] == "missing":
        (fix,) = [f.metadata["required"] for f in dataclasses.fields(cls) if f.metadata["env"] == var]
        return ConfigError(var, None, fix)
    return first.get("ctx", {}).get("error") or exc  # what the field's parser raised


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
