"""x-tool-runtime: a request may not move the tools elsewhere than the operator said, unless
the operator lets it (--tools-runtime-header); a malformed value is named first either way."""

from __future__ import annotations

import pytest

from llamaserve.tools.builtin import builtin_tools
from llamaserve.tools.fileio import RuntimeRefused
from llamaserve.tools.registry import HeaderRefused, Toolbox, make_runtime


def prepare(box: Toolbox, headers: dict[str, str]) -> str:
    tool = box.find("exec_shell_command", stream=False)
    return box.prepare(tool, {"command": "echo hi"}, headers).runtime


def test_the_header_is_refused_naming_it_and_the_flag() -> None:
    box = Toolbox(builtin_tools())
    with pytest.raises(HeaderRefused, match=r"x-tool-runtime: .*--tools-runtime-header"):
        prepare(box, {"x-tool-runtime": "ssh:build-host"})
    assert prepare(box, {}) == ""  # the host, as the operator left it


def test_the_operators_own_runtime_may_be_named_again() -> None:
    box = Toolbox(builtin_tools(), runtime=make_runtime("ssh:build-host"))
    assert prepare(box, {"x-tool-runtime": "ssh:build-host"}) == "ssh:build-host"
    with pytest.raises(HeaderRefused):
        prepare(box, {"x-tool-runtime": "ssh:other-host"})


def test_a_malformed_value_is_llama_servers_runtime_error_before_the_permission() -> None:
    box = Toolbox(builtin_tools())
    with pytest.raises(RuntimeRefused, match="invalid ssh target"):
        prepare(box, {"x-tool-runtime": "ssh:-oProxyCommand=touch /tmp/pwned"})


def test_with_the_flag_the_header_chooses() -> None:
    box = Toolbox(builtin_tools(), runtime_header=True)
    assert prepare(box, {"x-tool-runtime": "docker-container:abc123"}) == "docker-container:abc123"
