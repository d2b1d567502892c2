"""The flags that print something and exit: --help, --version, --completion-bash, --list-devices, --cache-list."""

from __future__ import annotations

import os
import sys

from llamaserve.cli.usage import render_completion, render_help


def run_action(action: str, prog: str) -> int:
    if action == "help":
        sys.stdout.write(render_help(prog) + "\n")
        return 0
    if action == "completion_bash":
        sys.stdout.write(render_completion(prog))
        return 0
    if action == "cache_list":
        from llamaserve.hub import format_cache_list, list_cached_models
        from llamaserve.hub.cache import cache_dir

        sys.stdout.write(format_cache_list(list_cached_models(cache_dir(os.environ))))
        return 0
    # The rest need libllama: imported only here so --help stays fast and works without it.
    from llamaserve.compose import devices_text, version_text

    if action == "version":
        sys.stdout.write(version_text())
        return 0
    if action == "list_devices":
        sys.stdout.write(devices_text())
        return 0
    raise AssertionError(f"unhandled informational flag: {action}")
