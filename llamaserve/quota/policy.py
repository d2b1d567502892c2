"""`--api-keys-config FILE`: API keys with a name and limits, read from TOML or JSON.

    usage_db = "/var/lib/llamaserve/usage.sqlite3"   # optional; --usage-db wins

    [[keys]]
    name = "alice"
    key = "sk-alice-…"
    requests_per_minute = 60
    tokens_per_minute = 40000      # prompt + completion tokens
    max_concurrent = 2             # requests in flight at once, streamed or not
    max_tokens = 512               # the largest max_tokens a request may ask for
    models = ["smol", "coder"]     # router mode: the models this key may use
    admin = true                   # GET /usage shows every key (else only its own)

Every limit is optional (absent: no limit). A file that cannot be read, a field we do not
know, a wrong type, a repeated name or key: a ConfigError naming it, so the server does
not start with limits other than the operator wrote.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass
from typing import Any

from llamaserve.config import ConfigError

_LIMITS = ("requests_per_minute", "tokens_per_minute", "max_concurrent", "max_tokens")
_KEY_FIELDS = {"name", "key", "models", "admin", *_LIMITS}


@dataclass(frozen=True)
class KeyPolicy:
    name: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    max_tokens: int | None = None
    models: frozenset[str] | None = None  # None: any model
    admin: bool = False


@dataclass(frozen=True)
class KeysConfig:
    # By the SHA-256 of the key: the secret itself is never a dict key, log field or label.
    by_digest: dict[bytes, KeyPolicy]
    secrets: tuple[str, ...]
    usage_db: str | None = None

    def policy_for(self, key: str | None) -> KeyPolicy | None:
        if key is None:
            return None
        return self.by_digest.get(digest(key))


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _parse(text: str, path: str) -> Any:
    flag = "--api-keys-config"
    if path.endswith(".json") or text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{flag}: {path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{flag}: {path} is not valid TOML: {exc}") from None


def _limit(entry: dict[str, Any], field: str, where: str) -> int | None:
    value = entry.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"--api-keys-config: {where}: {field} must be a whole number of at least 1, not {value!r}")
    return value


def _models(entry: dict[str, Any], where: str) -> frozenset[str] | None:
    value = entry.get("models")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(m, str) and m for m in value):
        raise ConfigError(f"--api-keys-config: {where}: models must be a list of model names")
    return frozenset(value)


def _policy(entry: Any, index: int) -> tuple[str, KeyPolicy]:
    where = f"keys[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"--api-keys-config: {where} must be a table (an object)")
    unknown = sorted(set(entry) - _KEY_FIELDS)
    if unknown:
        raise ConfigError(f"--api-keys-config: {where}: unknown field(s) {', '.join(unknown)}")
    name, key = entry.get("name"), entry.get("key")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"--api-keys-config: {where}: name must be a non-empty string")
    where = f"key {name!r}"
    if not isinstance(key, str) or not key.strip() or key != key.strip():
        raise ConfigError(f"--api-keys-config: {where}: key must be a non-empty string without surrounding spaces")
    admin = entry.get("admin", False)
    if not isinstance(admin, bool):
        raise ConfigError(f"--api-keys-config: {where}: admin must be true or false")
    limits = {field: _limit(entry, field, where) for field in _LIMITS}
    return key, KeyPolicy(name=name, models=_models(entry, where), admin=admin, **limits)


def parse_keys_config(text: str, path: str) -> KeysConfig:
    data = _parse(text, path)
    if not isinstance(data, dict):
        raise ConfigError(f"--api-keys-config: {path}: expected a table with a `keys` list")
    unknown = sorted(set(data) - {"keys", "usage_db"})
    if unknown:
        raise ConfigError(f"--api-keys-config: {path}: unknown field(s) {', '.join(unknown)}")
    entries = data.get("keys")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"--api-keys-config: {path}: `keys` must be a non-empty list")
    usage_db = data.get("usage_db")
    if usage_db is not None and not isinstance(usage_db, str):
        raise ConfigError(f"--api-keys-config: {path}: usage_db must be a path")
    by_digest: dict[bytes, KeyPolicy] = {}
    names: set[str] = set()
    secrets: list[str] = []
    for index, entry in enumerate(entries):
        key, policy = _policy(entry, index)
        if policy.name in names:
            raise ConfigError(f"--api-keys-config: the name {policy.name!r} is given to two keys")
        if digest(key) in by_digest:
            raise ConfigError(f"--api-keys-config: key {policy.name!r} repeats another entry's key")
        names.add(policy.name)
        by_digest[digest(key)] = policy
        secrets.append(key)
    return KeysConfig(by_digest=by_digest, secrets=tuple(secrets), usage_db=usage_db or None)


def load_keys_config(path: str) -> KeysConfig:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"--api-keys-config: cannot read {path}: {exc.strerror}") from exc
    return parse_keys_config(text, path)
