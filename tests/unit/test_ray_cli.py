"""`llama serve --ray`: our flags taken out of a llama-server command line, and a replica's own address."""

from __future__ import annotations

import pytest

from llamaserve.ray import app, parse_autoscale
from llamaserve.ray.cli import ray_main, split_args
from llamaserve.ray.replica import child_argv


def test_ray_flags_are_taken_out_and_the_rest_is_llama_server_s() -> None:
    rest, replicas, autoscale = split_args(["--ray", "-m", "x.gguf", "--replicas", "3", "-t", "2"])
    assert (rest, replicas, autoscale) == (["-m", "x.gguf", "-t", "2"], 3, None)
    rest, replicas, autoscale = split_args(["--ray", "--autoscale", "1:4", "-np", "2"])
    assert (rest, replicas, autoscale) == (["-np", "2"], 1, (1, 4))


@pytest.mark.parametrize(
    "args",
    [
        ["--ray", "--replicas", "0"],
        ["--ray", "--replicas", "two"],
        ["--ray", "--autoscale", "3:1"],
        ["--ray", "--autoscale", "2"],
        ["--ray", "--replicas", "2", "--autoscale", "1:2"],
        ["--ray", "--replicas"],
    ],
)
def test_bad_ray_flags_exit_1_before_ray_starts(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert ray_main(args) == 1
    assert "error:" in capsys.readouterr().err


def test_a_bad_server_flag_exits_1_before_ray_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert ray_main(["--ray", "--replicas", "2", "--no-such-flag"]) == 1
    assert "--no-such-flag" in capsys.readouterr().err


def test_the_builder_refuses_unknown_arguments_and_bad_ranges() -> None:
    with pytest.raises(ValueError, match="replics"):
        app({"args": "-m x.gguf", "replics": "2"})
    with pytest.raises(ValueError, match="MIN:MAX"):
        parse_autoscale("0:0")


def test_a_replica_s_server_listens_on_its_own_loopback_port() -> None:
    argv = child_argv(["-m", "x.gguf", "--host", "0.0.0.0", "--port", "8000", "--port=9", "-np", "2"], 4321)
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "4321"]
    assert "0.0.0.0" not in argv and "8000" not in argv and "--port=9" not in argv and "-np" in argv
