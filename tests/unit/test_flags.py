"""Every llama-server flag spelling is read as llama-server reads it: exactly, with its variable and its check."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from llamaserve.cli import config_from_args
from llamaserve.cli.argv import UsageError, parse
from llamaserve.cli.options import BY_SPELLING, OPTIONS, Opt
from llamaserve.config import ConfigError
from tests.llama_cpp_files import server_readme

SPELLING = re.compile(r"--?[a-zA-Z][-a-zA-Z0-9.]*")
# A value each kind of check accepts, so that every flag can be given once.
SAMPLE_VALUES = ("1", "q8_0", "on", "none", "auto", "0-1", "ff", "distribute", "x=int:1")


def reference_spellings() -> list[str]:
    out: list[str] = []
    for line in server_readme().splitlines():
        match = re.match(r"\| `([^`]*)`", line)
        if match:
            out += [t for t in re.split(r"[ ,]+", match.group(1)) if SPELLING.fullmatch(t)]
    return sorted(set(out))


@pytest.fixture()
def model_file(tmp_path: Path) -> str:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    return str(p)


def _accepted_value(opt: Opt) -> str:
    for sample in SAMPLE_VALUES:
        try:
            opt.type(sample)
        except ValueError:
            continue
        return sample
    raise AssertionError(f"no sample value fits {opt.names[0]}")


def test_every_reference_spelling_is_a_flag_of_ours() -> None:
    spellings = reference_spellings()
    assert len(spellings) > 400
    missing = [s for s in spellings if s not in BY_SPELLING]
    assert missing == []


def test_no_spelling_belongs_to_two_flags() -> None:
    seen: dict[str, str] = {}
    for opt in OPTIONS:
        for name in opt.spellings:
            assert name not in seen, f"{name} is both {seen[name]} and {opt.names[0]}"
            seen[name] = opt.names[0]


@pytest.mark.parametrize("spelling", [s for opt in OPTIONS for s in opt.names if opt.kind != "action"])
def test_each_spelling_parses_as_its_own_flag(spelling: str) -> None:
    opt, _ = BY_SPELLING[spelling]
    argv = [spelling]
    if opt.kind in ("value", "list"):
        argv.append(_accepted_value(opt))
    elif opt.kind == "two":
        argv += ["0", "1"]
    try:
        parsed = parse(argv, {})
    except UsageError as exc:
        assert opt.removed, exc  # only the removed flags refuse a good value
        assert "removed" in str(exc) and opt.removed in str(exc)
        return
    assert [g.opt for g in parsed.given] == [opt]


def test_multi_letter_short_flags_are_never_a_shorter_flag_with_an_attached_value() -> None:
    shorts = [s for opt in OPTIONS for s in opt.spellings if not s.startswith("--") and len(s) > 2]
    assert {"-ctk", "-ctv", "-ngl", "-ngld", "-ts", "-md", "-mg", "-np", "-cb", "-nocb", "-sm"} <= set(shorts)
    for spelling in shorts:
        opt, _ = BY_SPELLING[spelling]
        value = [_accepted_value(opt)] if opt.kind in ("value", "list") else ["0", "1"] if opt.kind == "two" else []
        parsed = parse([spelling, *value], {}) if not opt.removed and opt.kind != "action" else None
        if parsed is not None:
            assert parsed.given[0].opt is opt, spelling


@pytest.mark.parametrize(
    "argv",
    [
        ["--reasoning-form", "none"],  # a prefix of --reasoning-format
        ["--ctx", "4096"],  # a prefix of --ctx-size
        ["-ctx", "4096"],  # would be -c tx with attached values
        ["-tx", "2"],  # would be -t x
        ["--temperatur", "0.5"],
        ["--no-such-flag"],
    ],
)
def test_made_up_flags_are_refused_not_matched(argv: list[str]) -> None:
    with pytest.raises(UsageError, match="invalid argument"):
        parse(argv, {})


def test_reasoning_on_is_its_own_flag(model_file: str) -> None:
    cfg = config_from_args(["-m", model_file, "--reasoning", "on", "-rea", "off"], environ={})
    assert cfg.reasoning == "off"
    cfg = config_from_args(["-m", model_file, "--reasoning", "on"], environ={})
    assert cfg.reasoning == "on"


def test_kv_cache_types_and_placement_flags_reach_the_config(model_file: str) -> None:
    cfg = config_from_args(
        ["-m", model_file, "-ctk", "q8_0", "-ctv", "q4_0", "-ngl", "all", "-sm", "row", "-ts", "3,1", "-mg", "1"],
        environ={},
    )
    assert (cfg.tuning.cache_type_k, cfg.tuning.cache_type_v) == ("q8_0", "q4_0")
    assert (cfg.load.n_gpu_layers, cfg.load.split_mode, cfg.load.tensor_split, cfg.load.main_gpu) == (
        -2,
        "row",
        (3.0, 1.0),
        1,
    )
    assert cfg.hardware_flags == ("-ngl", "-sm", "-ts", "-mg")
    with pytest.raises(ConfigError, match="-ctk"):
        config_from_args(["-m", model_file, "-ctk", "q9_9"], environ={})


def test_variables_feed_the_nested_settings_and_flags_win(model_file: str) -> None:
    env = {"LLAMA_ARG_CACHE_TYPE_K": "q8_0", "LLAMA_ARG_REPACK": "false", "LLAMA_ARG_ROPE_SCALE": "2"}
    cfg = config_from_args(["-m", model_file], environ=env)
    assert (cfg.tuning.cache_type_k, cfg.load.repack, cfg.tuning.rope_scale) == ("q8_0", False, 2.0)
    cfg = config_from_args(["-m", model_file, "-ctk", "f16", "--repack"], environ=env)
    assert (cfg.tuning.cache_type_k, cfg.load.repack) == ("f16", True)


def test_underscores_in_long_flags_read_as_dashes(model_file: str) -> None:
    cfg = config_from_args(["-m", model_file, "--ctx_size", "512", "--cache_type_k", "q8_0"], environ={})
    assert (cfg.ctx_size, cfg.tuning.cache_type_k) == (512, "q8_0")


def test_text_flags_unescape_and_server_wide_sampling_defaults(model_file: str, tmp_path: Path) -> None:
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "yes"\n', encoding="utf-8")
    cfg = config_from_args(
        [
            "-m",
            model_file,
            "-r",
            "User:\\n",
            "-r",
            "###",
            "-l",
            "15043+1",
            "-l",
            "2-inf",
            "--grammar-file",
            str(grammar),
        ],
        environ={},
    )
    assert cfg.reverse_prompts == ("User:\n", "###")
    assert cfg.sampling.logit_bias == ((15043, 1.0), (2, float("-inf")))
    assert cfg.default_grammar == 'root ::= "yes"\n'
    cfg = config_from_args(["-m", model_file, "--no-escape", "-r", "a\\nb"], environ={})
    assert cfg.reverse_prompts == ("a\\nb",)
    with pytest.raises(ConfigError, match="logit-bias"):
        config_from_args(["-m", model_file, "-l", "hello"], environ={})


def test_dry_sequence_breakers_replace_the_defaults_and_none_clears(model_file: str) -> None:
    cfg = config_from_args(["-m", model_file, "--dry-sequence-breaker", "\\n\\n"], environ={})
    assert cfg.sampling.dry_sequence_breakers == ("\n\n",)
    cfg = config_from_args(["-m", model_file, "--dry-sequence-breaker", "none"], environ={})
    assert cfg.sampling.dry_sequence_breakers == ()


def test_presets_set_the_repo_and_settings_and_flags_after_them_win() -> None:
    parsed = parse(["--fim-qwen-7b-default", "--port", "9000"], {})
    assert parsed.values["hf_repo"] == "ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF"
    assert parsed.values["cache_reuse"] == 256
    assert parsed.values["port"] == 9000


@pytest.mark.parametrize(
    ("argv", "feature"),
    [
        (["--backend-sampling"], "backend sampling"),
    ],
)
def test_flags_of_features_not_built_yet_exit_1_naming_the_feature(
    argv: list[str], feature: str, model_file: str
) -> None:
    with pytest.raises(ConfigError, match=feature):
        config_from_args(["-m", model_file, *argv], environ={})


def test_the_draft_models_own_placement_flags_reach_its_load_settings(model_file: str) -> None:
    from llamaserve.config import CpuPlacement
    from llamaserve.model_load import model_load_settings
    from llamaserve.spec_setup import draft_load_settings

    argv = ["-m", model_file, "-md", model_file, "--spec-type", "draft-simple", "-dev", "none", "--mlock"]
    argv += ["-Cd", "0x3", "-Crd", "4-5", "--cpu-strict-draft", "1", "--prio-draft", "2", "--poll-draft", "0"]
    argv += ["-Cbd", "f0", "--cpu-strict-batch-draft", "0", "--prio-batch-draft", "1", "--poll-batch-draft", "10"]
    argv += ["-otd", "token_embd=CPU,output=CPU", "-otd", "blk\\.0\\.=CPU", "-cmoed", "-ncmoed", "1"]
    cfg = config_from_args(argv, environ={})
    assert cfg.draft_cpu == CpuPlacement(mask="3", range="4-5", strict=True, prio=2, poll=0)
    assert cfg.draft_cpu_batch == CpuPlacement(mask="f0", strict=False, prio=1, poll=10)
    assert cfg.cpu.is_default and cfg.cpu_batch.is_default
    target = model_load_settings(cfg)
    draft = draft_load_settings(cfg, target)
    # The target's own settings carry over (--mlock); the draft's placement replaces the target's.
    assert draft.load_mode == target.load_mode == "mmap+mlock" and target.override_tensor == ()
    assert draft.devices == "none" == target.devices
    assert draft.override_tensor == (
        "token_embd=CPU",
        "output=CPU",
        "blk\\.0\\.=CPU",
        r"\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU",
        r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU",
    )
    cfg = config_from_args([*argv, "-devd", "CPU"], environ={})
    assert draft_load_settings(cfg, model_load_settings(cfg)).devices == "CPU"


def test_prio_draft_takes_llama_servers_levels(model_file: str) -> None:
    with pytest.raises(ConfigError, match="--spec-draft-prio must be between 0 and 3"):
        config_from_args(["-m", model_file, "--prio-draft", "-1"], environ={})


def test_draft_backend_sampling_on_is_refused_with_the_reason(model_file: str) -> None:
    for argv, env in ((["--spec-draft-backend-sampling"], {}), ([], {"LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING": "1"})):
        with pytest.raises(ConfigError, match="only in the draft-eagle3/draft-mtp/draft-dflash drafters"):
            config_from_args(["-m", model_file, *argv], environ=env)
    cfg = config_from_args(["-m", model_file, "--no-spec-draft-backend-sampling"], environ={})
    assert cfg.spec.draft_backend_sampling is False


def test_the_spec_presets_name_a_target_and_a_draft_repo() -> None:
    parsed = parse(["--fim-qwen-14b-spec", "--port", "9000"], {})
    assert parsed.values["hf_repo"] == "ggml-org/Qwen2.5-Coder-14B-Q8_0-GGUF"
    assert parsed.values["spec.draft_hf_repo"] == "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF"
    assert parsed.values["spec.draft_hf_file"] == "qwen2.5-coder-0.5b-q8_0.gguf"
    assert parsed.values["spec.types"] == ("draft-simple",)


def test_multimodal_flags_reach_the_config(model_file: str) -> None:
    argv = ["-m", model_file, "-mmdev", "none", "--mtmd-batch-max-tokens", "256", "--video-fps", "2.5"]
    argv += ["--video-timestamp-interval", "1000", "--video-ffmpeg-dir", "/opt/ffmpeg/bin"]
    cfg = config_from_args(argv, environ={})
    assert (cfg.mmproj_device, cfg.mtmd_batch_max_tokens) == ("none", 256)
    assert (cfg.video_fps, cfg.video_timestamp_interval_ms, cfg.video_ffmpeg_dir) == (2.5, 1000, "/opt/ffmpeg/bin")
    cfg = config_from_args(["-m", model_file], environ={"MTMD_BACKEND_DEVICE": "none", "LLAMA_ARG_VIDEO_FPS": "1"})
    assert (cfg.mmproj_device, cfg.video_fps) == ("none", 1.0)


def test_rpc_servers_reach_the_load_settings(model_file: str) -> None:
    cfg = config_from_args(["-m", model_file, "--rpc", "127.0.0.1:50052, 10.0.0.2:50053"], environ={})
    assert cfg.load.rpc_servers == ("127.0.0.1:50052", "10.0.0.2:50053")
    cfg = config_from_args(["-m", model_file], environ={"LLAMA_ARG_RPC": "[::1]:50052"})
    assert cfg.load.rpc_servers == ("[::1]:50052",)


def test_upstreams_make_a_front_that_loads_no_model(model_file: str) -> None:
    cfg = config_from_args(["--upstreams", "http://a:8080/, http://10.0.0.2:8081"], environ={})
    assert cfg.upstreams == ("http://a:8080", "http://10.0.0.2:8081") and not cfg.router and not cfg.model
    with pytest.raises(ConfigError, match="--upstreams"):
        config_from_args(["--upstreams", "a:8080"], environ={})
    with pytest.raises(ConfigError, match="loads no model"):
        config_from_args(["-m", model_file, "--upstreams", "http://a:8080"], environ={})


def test_switching_features_off_reaches_the_config(model_file: str) -> None:
    on = ["--spec-type", "ngram-simple", "--agent"]
    cfg = config_from_args(["-m", model_file, *on], environ={})
    assert (cfg.spec.types, cfg.tools, cfg.ui_mcp_proxy) == (("ngram-simple",), ("all",), True)
    assert (cfg.mmproj_auto, cfg.cache_idle_slots, cfg.models_autoload) == (True, True, True)  # the defaults
    # The later flag wins, as in llama-server: each of these turns its feature off again.
    off = ["--spec-type", "none", "--no-agent", "--no-mmproj", "--no-cache-idle-slots", "--no-models-autoload"]
    cfg = config_from_args(["-m", model_file, *on, *off], environ={})
    assert (cfg.spec.types, cfg.tools, cfg.ui_mcp_proxy) == ((), (), False)
    assert (cfg.mmproj_auto, cfg.cache_idle_slots, cfg.models_autoload) == (False, False, False)


def test_removed_flags_say_what_replaced_them(model_file: str) -> None:
    with pytest.raises(ConfigError, match="spec-draft-n-max"):
        config_from_args(["-m", model_file, "--draft-max", "8"], environ={})


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llamaserve", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_every_spelling_grouped() -> None:
    out = _run("--help")
    assert out.returncode == 0
    assert out.stdout.index("----- common params") < out.stdout.index("----- sampling params")
    assert out.stdout.index("----- sampling params") < out.stdout.index("----- server-specific params")
    listed = set(SPELLING.findall(out.stdout))
    assert [s for opt in OPTIONS for s in opt.spellings if s not in listed] == []


def test_version_list_devices_and_completion() -> None:
    version = _run("--version")
    assert version.returncode == 0 and "llama-cpp-python 0.3.36" in version.stdout
    devices = _run("--list-devices")
    assert devices.returncode == 0 and devices.stdout.startswith("Available devices:")
    completion = _run("--completion-bash")
    assert completion.returncode == 0 and "complete -F" in completion.stdout and "--cache-type-k" in completion.stdout


def test_a_bad_value_exits_1_naming_the_flag() -> None:
    out = _run("--prio", "7")
    assert out.returncode == 1 and '"--prio"' in out.stderr
    out = _run("--threads")
    assert out.returncode == 1 and "expected value" in out.stderr


def test_mmproj_device_takes_one_gpu_or_none_never_the_cpu() -> None:
    """llama-server's -mmdev: "none" keeps the projector off the GPU; a CPU or unknown name is
    "invalid device"; two names are refused."""
    from llamaserve.llama.devices import DeviceError, offload_devices, pick_projector_device

    assert pick_projector_device("none") is None
    for bad in ("CPU", "nosuchgpu"):
        with pytest.raises(DeviceError, match=f"invalid device: {bad}"):
            pick_projector_device(bad)
    with pytest.raises(DeviceError, match="only one device"):
        pick_projector_device("A,B")
    for dev in offload_devices():  # a GPU build: each GPU by its name
        picked = pick_projector_device(dev.name)
        assert picked is not None and picked.name == dev.name
