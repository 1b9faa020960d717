"""One TOML file per daemon, overridable by environment and flags, mapped onto its argparse flags.

Owns the precedence rule, applied once at start-up: flags > environment > file > defaults.
Every key of the file and every `<PREFIX><KEY>` variable must name a flag (`heartbeat_interval_s`
is `--heartbeat-interval-s`); an unknown key, a wrong type or a value outside a flag's choices is
an error naming the key and the file (or the variable). Values then go through the daemon's own
validation exactly as flags do, so there is one set of rules. Shared by supervisor and agent.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_SKIP = {"help", "config"}


class ConfigFileError(ValueError):
    """The config file or an environment override is invalid; the text names the key and source."""


def add_config_flag(p: argparse.ArgumentParser, daemon: str, env_prefix: str) -> None:
    p.add_argument(
        "--config", type=pathlib.Path, default=None,
        help=f"TOML file of options (keys are flag names with '_', e.g. /etc/ftsup/{daemon}.toml);"
             f" precedence: flags > environment ({env_prefix}<KEY>) > file > defaults",
    )


def options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Flag destinations that a file or the environment may set (everything but --help/--config)."""
    return {a.dest: a for a in p._actions if a.option_strings and a.dest not in _SKIP}


def _is_bool(action: argparse.Action) -> bool:
    return isinstance(action, (argparse.BooleanOptionalAction, argparse._StoreTrueAction,
                               argparse._StoreFalseAction))


def _type_name(action: argparse.Action) -> str:
    if _is_bool(action):
        return "a boolean"
    if action.type is int:
        return "an integer"
    return "a number" if action.type is float else "a string"


def _checked(action: argparse.Action, value: Any) -> Any:
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"must be one of {sorted(action.choices)}, got {value!r}")
    return value


def from_toml_value(action: argparse.Action, value: Any) -> Any:
    """A TOML value converted to what argparse would have produced for the flag; ValueError if wrong."""
    wrong = ValueError(f"must be {_type_name(action)}, got {type(value).__name__} {value!r}")
    if _is_bool(action):
        if not isinstance(value, bool):
            raise wrong
        return value
    if isinstance(value, bool):
        raise wrong
    if action.type is int:
        if not isinstance(value, int):
            raise wrong
        return _checked(action, value)
    if action.type is float:
        if not isinstance(value, (int, float)):
            raise wrong
        return _checked(action, float(value))
    convert = action.type
    if isinstance(value, int) and callable(convert) and getattr(convert, "takes_int", False):
        return convert(str(value))  # e.g. --checkpoint-every-steps: a count or "auto"
    # String-valued flags; a list of strings stands for a comma-separated flag value.
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {type(value).__name__} {value!r}")
    return _checked(action, action.type(value) if callable(action.type) else value)


def from_env_value(action: argparse.Action, text: str) -> Any:
    """An environment string converted like the flag's own parser would; ValueError if wrong."""
    if _is_bool(action):
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(f"must be a boolean (true/false/1/0), got {text!r}")
    converter = action.type if callable(action.type) else str
    try:
        value = converter(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be {_type_name(action)}, got {text!r}") from exc
    return _checked(action, value)


def load_file(path: pathlib.Path, known: Mapping[str, argparse.Action]) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigFileError(f"cannot read config file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"config file {path} is not valid TOML: {exc}") from exc
    values: dict[str, Any] = {}
    for key, value in raw.items():
        action = known.get(key)
        if action is None:
            raise ConfigFileError(f"config file {path}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        try:
            values[key] = from_toml_value(action, value)
        except ValueError as exc:
            raise ConfigFileError(f"config file {path}: key {key!r} {exc}") from exc
    return values


def load_env(environ: Mapping[str, str], prefix: str, known: Mapping[str, argparse.Action],
             ignore: frozenset[str] = frozenset()) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, text in sorted(environ.items()):
        if not name.startswith(prefix) or name == prefix or name in ignore:
            continue
        key = name[len(prefix):].lower()
        action = known.get(key)
        if action is None:
            raise ConfigFileError(f"environment variable {name}: {key!r} is not an option"
                                  f" (known: {', '.join(sorted(known))})")
        try:
            values[key] = from_env_value(action, text)
        except ValueError as exc:
            raise ConfigFileError(f"environment variable {name} {exc}") from exc
    return values


def parse_layered(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, *, env_prefix: str,
    environ: Mapping[str, str] | None = None, ignore_env: frozenset[str] = frozenset(),
) -> argparse.Namespace:
    """Parses argv over the environment over the --config file over the parser's defaults.

    `ignore_env` names variables under the prefix that are not options (the agent's trainers get
    FTSUP_AGENT_ADDRESS). Raises ConfigFileError; argparse itself exits 2 on unknown flags.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=pathlib.Path, default=None)
    known_args, _ = pre.parse_known_args(argv)
    known = options(p)
    layered: dict[str, Any] = {}
    if known_args.config is not None:
        layered.update(load_file(known_args.config, known))
    layered.update(load_env(os.environ if environ is None else environ, env_prefix, known, ignore_env))
    if layered:
        p.set_defaults(**layered)
        for dest in layered:
            known[dest].required = False  # supplied by the file or the environment
    return p.parse_args(argv)
