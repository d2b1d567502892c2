"""What the quota middleware needs, from the server's config: the keys and the usage ledger."""

from __future__ import annotations

from pathlib import Path

from llamaserve.config import ServerConfig
from llamaserve.quota.policy import KeysConfig, load_keys_config
from llamaserve.quota.usage import UsageLedger, UsageStore, default_usage_db


def quota_parts(config: ServerConfig) -> tuple[KeysConfig, UsageLedger] | None:
    """None without --api-keys-config: no limits and no usage counting at all."""
    if not config.api_keys_config:
        return None
    keys = load_keys_config(config.api_keys_config)
    where = config.usage_db or keys.usage_db
    path = Path(where).expanduser() if where else default_usage_db()
    return keys, UsageLedger(UsageStore(path))
