"""The one error type of the hub package."""

from __future__ import annotations

from llamaserve.config import ConfigError


class DownloadError(ConfigError):
    """A model could not be found, listed or downloaded (or is not cached with --offline).

    A `ConfigError`, so the command line reports it like a bad flag: one line
    on stderr and exit code 1, never a traceback.
    """


class HubUnreachable(DownloadError):
    """The hub could not be asked at all (no network, refused, timed out): the cache may still serve."""
