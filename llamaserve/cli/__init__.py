"""Command line: llama-server's flags and LLAMA_ARG_* variables → ServerConfig.

`llama-server [flags]` (and `llama serve [flags]`) land in `main`. The flag table is
`options.py`, the reading of argv and the environment `argv.py`, the turning of what was read
into a `ServerConfig` `build.py`, and the informational flags (`--version`, `--list-devices`,
...) `info.py`. A command-line flag beats its environment variable, as in llama-server.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from llamaserve.cli.argv import Parsed, UsageError, noop_flags, parse, pending_features
from llamaserve.cli.build import build_config
from llamaserve.cli.info import run_action
from llamaserve.config import ConfigError, ServerConfig


def config_from_args(argv: Sequence[str], environ: dict[str, str] | None = None) -> ServerConfig:
    """The config a command line asks for; ConfigError when it cannot be served."""
    env = dict(os.environ if environ is None else environ)
    try:
        parsed = parse(argv, env)
    except UsageError as exc:
        raise ConfigError(str(exc)) from exc
    return _config(parsed, env)


def _config(parsed: Parsed, env: dict[str, str]) -> ServerConfig:
    missing = pending_features(parsed)
    if missing:
        spelling, feature = missing[0]
        raise ConfigError(f"{spelling}: {feature} is not part of llamaserve yet, so this flag cannot be honoured")
    for spelling, why in noop_flags(parsed):
        sys.stderr.write(f"warning: {spelling} has no effect: {why}\n")
    return build_config(parsed, env)


def main(argv: Sequence[str] | None = None, prog: str = "llama-server") -> int:
    """Entry point of `llama-server`."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    try:
        parsed = parse(args, env)
        if parsed.actions:  # --help, --version, ...: print and exit before anything loads
            return run_action(parsed.actions[0], prog)
        config = _config(parsed, env)
    except UsageError as exc:
        message = str(exc)  # llama-server's own wording, which sometimes starts with "error"
        prefix = "" if message.startswith("error") else "error: "
        sys.stderr.write(f"{prefix}{message}\n\nto show complete usage, run with -h\n")
        return 1
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:  # Ctrl-C during a download: the .part file stays for a resume
        sys.stderr.write("interrupted\n")
        return 130
    if config.upstreams:
        from llamaserve.scale import serve_upstreams  # deferred: a front never loads libllama

        return serve_upstreams(config)
    if config.router:
        from llamaserve.router import serve_router  # deferred: a router never loads libllama

        return serve_router(config, args, env)
    # The model's file starts loading on a thread of its own before the rest of the server is
    # imported (the composition root, the engine, the app): llama.cpp reads it without the GIL.
    # Deferred like compose: --help and a bad flag answer without loading libllama.
    from llamaserve.model_load import begin_model_load

    load = begin_model_load(config)
    try:
        from llamaserve.compose import serve

        return serve(config, load)
    finally:
        load.discard()  # a no-op once the server took the model; else the process must not end mid-load


def entry_llama_server() -> None:
    sys.exit(main())
