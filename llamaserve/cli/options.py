"""Every llama-server flag, in llama-server's groups and order, so `--help` reads like llama-server's.

One row per flag (`opt.Opt`): spellings, value check, environment variable, group, destination.
The destination names a `ServerConfig` field; a dotted one (`load.split_mode`) a field of one of
its parts. Defaults live on the config dataclasses, not here, so they are stated once. The rows
are kept by group: `options_common.py`, `options_sampling.py`, `options_server.py` (our own
server flags, which follow llama-server's in that group, in `options_own.py`),
`options_speculative.py` (speculative decoding and the draft model) and
`options_presets.py`.
"""

from __future__ import annotations

from llamaserve.cli.opt import COMMON, SAMPLING, SERVER, Opt
from llamaserve.cli.options_common import COMMON_OPTIONS
from llamaserve.cli.options_presets import PRESET_OPTIONS
from llamaserve.cli.options_sampling import SAMPLING_OPTIONS
from llamaserve.cli.options_server import SERVER_OPTIONS
from llamaserve.cli.options_speculative import SPECULATIVE_OPTIONS

__all__ = ["BY_SPELLING", "COMMON", "OPTIONS", "SAMPLING", "SERVER", "Opt"]

OPTIONS: tuple[Opt, ...] = COMMON_OPTIONS + SAMPLING_OPTIONS + SERVER_OPTIONS + SPECULATIVE_OPTIONS + PRESET_OPTIONS

BY_SPELLING: dict[str, tuple[Opt, bool]] = {}
for _opt in OPTIONS:
    for _name in _opt.names:
        BY_SPELLING[_name] = (_opt, True)
    for _name in _opt.neg:
        BY_SPELLING[_name] = (_opt, False)
