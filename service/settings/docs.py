"""The settings described from the code: ``docs/settings.md`` and ``driftline settings``.

:func:`markdown` writes the reference of every setting, grouped by concern, from the
fields themselves (name, variable, type, default, description), so the document cannot
drift from the code: ``python -m service.settings.docs > docs/settings.md`` (or
``driftline settings --markdown``) regenerates it, and a test fails while it is stale.
:func:`effective` says what a running configuration holds and where each value came
from, with secrets masked.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import types
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from service.settings import GROUPS, Settings, group_of, settings_groups

#: What a secret is shown as.
MASK = "********"

#: Words that make a setting's name, or a URL query parameter's, a secret's.
_SECRET_WORDS = ("password", "passwd", "pwd", "secret", "token", "key", "signature", "credential")

#: ``scheme://user:password@``: the password of a URL's user information.
_URL_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:?#]*):[^/@?#]*@")
#: ``?name=value`` and ``&name=value`` of a URL's query.
_QUERY_PARAMETER = re.compile(r"([?&;])([^=&;#]*)=([^&;#]*)")


def env_variable(name: str) -> str:
    """The environment variable of the setting ``name``.

    >>> env_variable("retrain_workers")
    'DRIFTLINE_RETRAIN_WORKERS'
    """
    return f"{Settings.model_config.get('env_prefix', '')}{name}".upper()


def _secret_name(name: str) -> bool:
    """Whether a name (a setting's or a query parameter's) says it holds a secret.

    >>> [_secret_name(n) for n in ("session_secret", "api_key", "X-Amz-Signature", "host")]
    [True, True, True, False]
    """
    words = [word for word in re.split(r"[^a-z0-9]+", name.lower()) if word]
    return any(word.endswith(_SECRET_WORDS) for word in words)


def mask_url(text: str) -> str:
    """``text`` with a URL's password and secret query parameters masked.

    >>> mask_url("postgresql+psycopg://app:hunter2@db:5432/driftline")
    'postgresql+psycopg://app:********@db:5432/driftline'
    >>> mask_url("s3://models/driftline?region=eu-west-1&access_key=AKIA1")
    's3://models/driftline?region=eu-west-1&access_key=********'
    >>> mask_url("sqlite:////srv/data/driftline.db")
    'sqlite:////srv/data/driftline.db'
    """
    if "://" not in text:
        return text
    text = _URL_PASSWORD.sub(rf"\1:{MASK}@", text)

    def parameter(match: re.Match[str]) -> str:
        separator, name, value = match.groups()
        return f"{separator}{name}={MASK if _secret_name(name) and value else value}"

    return _QUERY_PARAMETER.sub(parameter, text)


def _is_secret(name: str, value: Any) -> bool:
    if isinstance(value, SecretStr):
        return True
    return isinstance(value, str) and _secret_name(name)


def json_value(name: str, value: Any) -> Any:
    """A setting's value as JSON holds it, with secrets masked."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if _is_secret(name, value):
        return MASK
    if isinstance(value, tuple | list):
        return [mask_url(str(item)) for item in value]
    return mask_url(str(value))


def shown(name: str, value: Any) -> str:
    """A setting's value as text, as a flag or a variable would give it, secrets masked.

    >>> shown("public_paths", ("/healthz", "/metrics")), shown("cors_origins", ())
    ('/healthz,/metrics', 'none')
    >>> shown("insecure", False), shown("refresh_events", None), shown("session_secret", "s")
    ('false', 'none', '********')
    """
    value = json_value(name, value)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value) if value else "none"
    return str(value)


def type_name(annotation: Any) -> str:
    """What a setting takes, in words, from its field's type.

    >>> type_name(int | None), type_name(Literal["exact", "ann", "auto"])
    ('integer or none', 'exact, ann or auto')
    """
    args = get_args(annotation)
    origin = get_origin(annotation)
    if origin is Literal:
        choices = [str(arg) for arg in args]
        return f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]
    if origin in (Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        named = " or ".join(type_name(arg) for arg in kept)
        return f"{named} or none" if len(kept) < len(args) else named
    if origin is tuple:
        return "comma-separated list"
    names = {
        bool: "true or false",
        int: "integer",
        float: "number",
        str: "text",
        Path: "path",
        SecretStr: "secret text",
    }
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _description(field: FieldInfo) -> str:
    return " ".join((field.description or "").split())


def _cell(text: str) -> str:
    """Text in a markdown table cell: pipes escaped."""
    return text.replace("|", "\\|")


def markdown() -> str:
    """``docs/settings.md``: every setting, grouped by concern, from the fields."""
    lines = [
        "# Settings",
        "",
        "<!-- Generated from service/settings/ by `driftline settings --markdown`"
        " (or `python -m service.settings.docs`); edit the fields, not this file. -->",
        "",
        "Every setting is a flag of `driftline serve`, `driftline consume` and `driftline "
        "settings` (the name in kebab case: `retrain_workers` is `--retrain-workers`) and "
        "an environment variable (`DRIFTLINE_RETRAIN_WORKERS`). A flag wins over the "
        "variable, which wins over the default; `none` clears a setting that may be empty. "
        "`driftline settings` prints the values in force and where each came from.",
        "",
    ]
    fields = Settings.model_fields
    for group, names in settings_groups().items():
        summary = " ".join(inspect.cleandoc(GROUPS[group].__doc__ or "").split())
        lines += [f"## {group.capitalize()}", "", summary, ""]
        lines += [
            "| Setting | Environment variable | Type | Default | Description |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name in names:
            field = fields[name]
            cells = [
                f"`{name}`",
                f"`{env_variable(name)}`",
                type_name(field.annotation),
                f"`{shown(name, field.default)}`",
                _description(field),
            ]
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines)


@dataclass(frozen=True)
class Entry:
    """One setting in force: its value (secrets masked) and where it came from.

    ``source`` is ``flag``, ``env`` (``variable`` names which) or ``default``.
    """

    group: str
    name: str
    value: Any
    source: Literal["flag", "env", "default"]
    variable: str | None = None

    @property
    def shown(self) -> str:
        return shown(self.name, self.value)

    @property
    def origin(self) -> str:
        return f"env {self.variable}" if self.source == "env" else self.source


def effective(
    settings: Settings, given: Collection[str] = (), environ: Mapping[str, str] | None = None
) -> list[Entry]:
    """Every setting of ``settings`` with where its value came from.

    ``given`` names the settings given as flags (arguments to ``Settings``); a variable
    counts where ``Settings`` reads one, matched without regard to case as it is.
    """
    environ = os.environ if environ is None else environ
    variables = {key.upper(): key for key in environ}
    entries = []
    for name in Settings.model_fields:
        value = getattr(settings, name)
        variable = variables.get(env_variable(name))
        if name in given:
            entry = Entry(group_of(name), name, value, "flag")
        elif variable is not None:
            entry = Entry(group_of(name), name, value, "env", variable)
        else:
            entry = Entry(group_of(name), name, value, "default")
        entries.append(entry)
    return entries


def as_json(entries: list[Entry]) -> dict[str, dict[str, dict[str, Any]]]:
    """Entries as ``{group: {setting: {"value", "source"[, "variable"]}}}``."""
    out: dict[str, dict[str, dict[str, Any]]] = {group: {} for group in GROUPS}
    for entry in entries:
        item: dict[str, Any] = {"value": json_value(entry.name, entry.value)}
        item["source"] = entry.source
        if entry.variable is not None:
            item["variable"] = entry.variable
        out[entry.group][entry.name] = item
    return out


def as_text(entries: list[Entry]) -> str:
    """Entries grouped by concern, one ``name = value  (source)`` line each."""
    width = max(len(entry.name) for entry in entries)
    lines: list[str] = []
    for group in GROUPS:
        lines.append(group)
        lines += [
            f"  {entry.name:<{width}} = {entry.shown}  ({entry.origin})"
            for entry in entries
            if entry.group == group
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
