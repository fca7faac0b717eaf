"""Named sets of settings, kept as data: one JSON file per preset in this folder, read by ``swarm-gdrive demo``,
the notebooks (``SMALL_MODEL_SETTINGS``, ``TEST_MODE``), :mod:`swarm_gdrive.config` and the benchmarks alike, so a
preset is changed in one place.

A file ``<name>.json`` holds::

    {
      "description": "what the preset is for (required)",
      "aliases": ["short names it also answers to"],
      "extends": "another preset: its settings first, then this file's, which override them",
      "settings": {"VARIABLE": "value as in the environment", "TASK_CONFIG": {"a JSON object": "its JSON text"}},
      "why": {"VARIABLE": "why this value"}
    }

This module reads files only: it sits below :mod:`swarm_gdrive.config` (which exports the presets as
``TEST_MODE_PRESET``, ``SMALL_MODEL_PRESET``, ...), so that every variable a preset sets is a setting of
``config`` is checked by the tests (tests/unit/test_presets.py), not here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable  # Python 3.11+; a folder of files, a Path included

#: Where the presets are, as a user finds them in the repository.
FOLDER = "swarm_gdrive/presets"
_KEYS = {"description", "aliases", "extends", "settings", "why"}
_VARIABLE = re.compile(r"[A-Z][A-Z0-9_]*\Z")
_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")


class PresetError(ValueError):
    """A preset that does not exist, or a preset file that is not well formed (the message names the file)."""


@dataclasses.dataclass(frozen=True)
class Preset:
    """One preset with ``extends`` resolved: ``settings`` are the variables it sets, in order (its base's first)."""

    name: str
    description: str
    aliases: tuple[str, ...]
    extends: str | None
    settings: Mapping[str, str]
    why: Mapping[str, str]


def names() -> tuple[str, ...]:
    """Every preset's name (its file's name without ``.json``), sorted; aliases are not listed."""
    return tuple(sorted(_presets()))


def get(name: str) -> Preset:
    """The preset called ``name`` or one of its aliases; :class:`PresetError` names the presets there are."""
    presets = _presets()
    if name in presets:
        return presets[name]
    for preset in presets.values():
        if name in preset.aliases:
            return preset
    known = ", ".join(f"{p.name} (or {', '.join(p.aliases)})" if p.aliases else p.name for p in presets.values())
    raise PresetError(f"unknown preset {name!r}: the presets are {known} ({FOLDER}/*.json)")


def load(name: str) -> dict[str, str]:
    """The environment variables the preset ``name`` sets (a new dict: the caller may change it)."""
    return dict(get(name).settings)


@functools.cache
def _presets() -> dict[str, Preset]:
    """This package's presets, read once (the files ship with the package: setup.py's package_data)."""
    return read_folder(resources.files(__name__))


def read_folder(folder: Traversable, label: str = FOLDER) -> dict[str, Preset]:
    """Every ``*.json`` preset of ``folder`` by name, checked and with ``extends`` resolved; ``label`` names the
    folder in error messages."""
    raw = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            name = entry.name.removesuffix(".json")
            where = f"{label}/{entry.name}"
            if not _NAME.match(name):
                raise PresetError(f"{where}: a preset's name is lower-case letters, digits and '-'; rename the file")
            try:
                raw[name] = json.loads(entry.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise PresetError(f"{where}: not valid JSON ({e})") from None
            _check(where, raw[name])
    presets: dict[str, Preset] = {}
    for name in raw:
        _resolve(name, raw, presets, (), label)
    _check_aliases(presets, label)
    return presets


def _check(where: str, data: Any) -> None:
    """One file's shape; every message names the file and the field."""
    if not isinstance(data, dict):
        raise PresetError(f"{where}: write a JSON object with 'description' and 'settings'")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise PresetError(f"{where}: unknown field(s) {', '.join(unknown)}; the fields are {', '.join(sorted(_KEYS))}")
    if not isinstance(data.get("description"), str) or not data["description"].strip():
        raise PresetError(f"{where}: 'description' is required: say what the preset is for")
    settings = data.get("settings")
    if not isinstance(settings, dict) or not settings:
        raise PresetError(f"{where}: 'settings' is required: an object of VARIABLE: value")
    for var, value in settings.items():
        if not _VARIABLE.match(var):
            raise PresetError(f"{where}: settings: {var!r} is not an environment variable's name (VARIABLE_NAME)")
        if not isinstance(value, (str, dict)):
            raise PresetError(
                f"{where}: settings: {var} = {value!r}: write the value as a string, as in the environment "
                "(or a JSON object, for a variable whose value is JSON)"
            )
    why = data.get("why", {})
    if not isinstance(why, dict) or not all(isinstance(v, str) for v in why.values()):
        raise PresetError(f"{where}: 'why' is an object of VARIABLE: reason")
    stray = sorted(set(why) - set(settings))
    if stray:
        raise PresetError(f"{where}: 'why' explains {', '.join(stray)}, which 'settings' does not set")
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and _NAME.match(a) for a in aliases):
        raise PresetError(f"{where}: 'aliases' is a list of names (lower-case letters, digits and '-')")
    if "extends" in data and not isinstance(data["extends"], str):
        raise PresetError(f"{where}: 'extends' is the name of another preset")


def _resolve(name: str, raw: dict[str, dict], done: dict[str, Preset], chain: tuple[str, ...], label: str) -> Preset:
    """``name`` with its base's settings first (bases resolved first; a circle of ``extends`` is an error)."""
    if name in done:
        return done[name]
    where = f"{label}/{name}.json"
    data = raw[name]
    settings: dict[str, str] = {}
    why: dict[str, str] = {}
    base = data.get("extends")
    if base is not None:
        if base not in raw:
            raise PresetError(f"{where}: extends {base!r}, which is not a preset; the presets are {', '.join(raw)}")
        if base in chain or base == name:
            raise PresetError(f"{where}: 'extends' goes round in a circle: {' -> '.join((*chain, name, base))}")
        parent = _resolve(base, raw, done, (*chain, name), label)
        settings.update(parent.settings)
        why.update(parent.why)
    for var, value in data["settings"].items():
        settings[var] = value if isinstance(value, str) else json.dumps(value)
        why.pop(var, None)  # a base's reason does not explain this file's value
    why.update(data.get("why", {}))
    done[name] = Preset(
        name=name,
        description=data["description"],
        aliases=tuple(data.get("aliases", ())),
        extends=base,
        settings=MappingProxyType(settings),
        why=MappingProxyType(why),
    )
    return done[name]


def _check_aliases(presets: dict[str, Preset], label: str) -> None:
    """An alias names one preset only, and no preset is named like another's alias."""
    seen: dict[str, str] = {}
    for preset in presets.values():
        for alias in preset.aliases:
            if alias in presets or alias in seen:
                other = seen.get(alias, alias)
                raise PresetError(
                    f"{label}/{preset.name}.json: alias {alias!r} already names the preset {other!r}; choose another"
                )
            seen[alias] = preset.name
