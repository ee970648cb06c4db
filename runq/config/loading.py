"""Reading the file and the environment into a ``Config``: unknown keys suggest the
nearest known one, environment values are coerced to the key's type."""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from runq.config.budget import BudgetLimit
from runq.config.http import JwtConfig
from runq.config.limits import LimitConfig
from runq.config.queue import TRANSPORTS
from runq.config.root import Config
from runq.config.schedules import ScheduleConfig
from runq.config.validation import validate
from runq.errors import ConfigError

#: Sections whose keys are free-form (maps), not fixed fields.
_FREE_SECTIONS = frozenset({"routing", "components", "schedules", "limits"})


def _struct_fields(struct_type: type[msgspec.Struct]) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(struct_type)}


def _known_keys() -> dict[str, type[msgspec.Struct] | None]:
    """Dotted section name → its Struct (None for free-form maps)."""
    sections: dict[str, type[msgspec.Struct] | None] = {}
    for name, typ in _struct_fields(Config).items():
        if name in _FREE_SECTIONS:
            sections[name] = None
        else:
            sections[name] = typ
    sections["http.jwt"] = JwtConfig
    return sections


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(sorted(options))}"


def _check_unknown_keys(data: Mapping[str, Any]) -> None:
    sections = _known_keys()
    top = [s for s in sections if "." not in s]
    for name, value in data.items():
        if name not in sections:
            raise ConfigError(name, f"unknown section{_suggest(name, top)}")
        struct = sections[name]
        if name == "schedules" and isinstance(value, list):
            # An array of tables: each entry is checked against ScheduleConfig by index.
            for i, entry in enumerate(value):
                if isinstance(entry, Mapping):
                    _check_table(f"schedules[{i}]", entry, ScheduleConfig)
            continue
        if struct is None:
            _check_free_section(name, value)
            continue
        if name == "budget" and isinstance(value, Mapping):
            # Not a list: decoding names ``budget.limits`` and says what it expected.
            limits = value.get("limits")
            for i, limit in enumerate(limits if isinstance(limits, list) else []):
                if isinstance(limit, Mapping):
                    _check_table(f"budget.limits[{i}]", limit, BudgetLimit)
        if isinstance(value, Mapping):
            _check_table(name, value, struct)


def _check_free_section(name: str, table: Any) -> None:
    """Value types of the free-form maps, checked here because msgspec's error for a bad map
    value says ``components[...]`` and would not name the entry."""
    if not isinstance(table, Mapping):
        return  # decoding reports "expected object" at the section itself
    for entry, value in table.items():
        key = f'{name}."{entry}"'
        if name == "routing" and not isinstance(value, str):
            raise ConfigError(key, f"must be a transport name ({', '.join(TRANSPORTS)})")
        if name == "components" and not isinstance(value, str | Mapping):
            raise ConfigError(key, "must be 'module:function' or a table with a kind")
        if name == "limits":
            if not isinstance(value, Mapping):
                raise ConfigError(key, "must be a table (max_running, max_running_per_key, rate)")
            _check_table(key, value, LimitConfig)
            _check_limit_types(key, value)


def _check_limit_types(key: str, table: Mapping[str, Any]) -> None:
    """Named here: msgspec's own message would say ``limits[...]``."""
    for name in ("max_running", "max_running_per_key"):
        value = table.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{key}.{name}", f"{value!r} must be a whole number")
    rate = table.get("rate")
    if rate is not None and not isinstance(rate, str):
        raise ConfigError(f"{key}.rate", f"{rate!r} must be a string like '100/minute'")


def _check_table(prefix: str, table: Mapping[str, Any], struct: type[msgspec.Struct]) -> None:
    fields = list(_struct_fields(struct))
    for key, value in table.items():
        if key not in fields:
            raise ConfigError(f"{prefix}.{key}", f"unknown key{_suggest(key, fields)}")
        if prefix == "http" and key == "jwt" and isinstance(value, Mapping):
            _check_table("http.jwt", value, JwtConfig)


def _env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``RUNQ_<SECTION>_<KEY>`` for known scalar/list keys only; others are ignored."""
    found: dict[str, dict[str, str]] = {}
    for section, struct in _known_keys().items():
        if struct is None:
            continue
        for key, typ in _struct_fields(struct).items():
            if isinstance(typ, type) and issubclass(typ, msgspec.Struct):
                continue
            env_name = "RUNQ_" + f"{section}_{key}".replace(".", "_").upper()
            if env_name in environ:
                found.setdefault(section, {})[key] = environ[env_name]
    return found


def _coerce_env(section: str, key: str, raw: str) -> Any:
    struct = _known_keys()[section]
    assert struct is not None
    typ = _struct_fields(struct)[key]
    text = str(typ)
    if "tuple" in text or "list" in text:
        raw = raw.strip()
        if raw.startswith("["):
            try:
                return msgspec.json.decode(raw)
            except msgspec.DecodeError as e:
                raise ConfigError(
                    f"{section}.{key}", f"environment value is not a JSON list: {e}"
                ) from e
        return [part.strip() for part in raw.split(",") if part.strip()]
    if typ is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{section}.{key}", f"{raw!r} is not a boolean (true/false)")
    if typ is int or typ is float or "float" in text or "int" in text:
        try:
            number = float(raw)
        except ValueError as e:
            raise ConfigError(f"{section}.{key}", f"{raw!r} is not a number") from e
        return int(number) if typ is int and number.is_integer() else number
    return raw


def _merge(data: dict[str, Any], overrides: dict[str, dict[str, str]]) -> dict[str, Any]:
    merged = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    for section, values in overrides.items():
        parts = section.split(".")
        target = merged
        for part in parts:
            nxt = target.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                target[part] = nxt
            else:
                nxt = dict(nxt)
                target[part] = nxt
            target = nxt
        for key, raw in values.items():
            target[key] = _coerce_env(section, key, raw)
    return merged


_PATH_RE = re.compile(r"at `\$\.?(?P<path>[^`]*)`")


def _decode(data: Mapping[str, Any]) -> Config:
    try:
        return msgspec.convert(data, Config, strict=False)
    except msgspec.ValidationError as e:
        message = str(e)
        match = _PATH_RE.search(message)
        key = match.group("path") if match else "config"
        key = re.sub(r"\[(\d+)\]", r"[\1]", key) or "config"
        reason = _PATH_RE.sub("", message).rstrip(" -")
        raise ConfigError(key, reason) from e


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    store_url: str | None = None,
) -> Config:
    """Load and validate. ``path`` None falls back to ``RUNQ_CONFIG``, then to defaults."""
    env = os.environ if environ is None else environ
    file_path = path if path is not None else env.get("RUNQ_CONFIG") or None
    data: dict[str, Any] = {}
    if file_path is not None:
        data = read_toml(Path(file_path))
        _check_unknown_keys(data)
    data = _merge(data, _env_overrides(env))
    config = _decode(data)
    if store_url:
        config = config.with_store_url(store_url)
    validate(config)
    return config


def read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError("--config", f"{path}: no such file") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("--config", f"{path}: cannot read ({e})") from e
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", f"{path}: not valid TOML ({e})") from e
