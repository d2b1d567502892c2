"""llama-server's model presets: an `-hf` repo with the settings llama-server gives it."""

from __future__ import annotations

from typing import Any

from llamaserve.cli.opt import Opt, preset

_FIM: dict[str, Any] = {"batch_size": 1024, "ubatch_size": 1024, "ctx_size": 0, "cache_reuse": 256, "port": 8012}
_GPT_OSS: dict[str, Any] = {
    "port": 8013,
    "ubatch_size": 2048,
    "batch_size": 32768,
    "n_parallel": 2,
    "ctx_size": 131072 * 2,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.01,
    "jinja": True,
}


def _fim(size: str, quant_file: str) -> dict[str, Any]:
    return {"hf_repo": f"ggml-org/Qwen2.5-Coder-{size}-Q8_0-GGUF", "hf_file": quant_file, **_FIM}


def _fim_spec(size: str, quant_file: str) -> dict[str, Any]:
    """A FIM preset with Qwen 2.5 Coder 0.5B as its draft model (-hf and -hfd, as llama-server).

    llama-server's preset leaves --spec-type at none, so it loads the draft and never drafts with
    it; this one also turns draft-simple on, which is what the preset says it is for.
    """
    return {
        **_fim(size, quant_file),
        "spec.draft_hf_repo": "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF",
        "spec.draft_hf_file": "qwen2.5-coder-0.5b-q8_0.gguf",
        "spec.types": ("draft-simple",),
    }


PRESET_OPTIONS: tuple[Opt, ...] = (
    preset(
        "--embd-gemma-default",
        {
            "hf_repo": "ggml-org/embeddinggemma-300M-qat-q4_0-GGUF",
            "hf_file": "embeddinggemma-300M-qat-Q4_0.gguf",
            "port": 8011,
            "ubatch_size": 2048,
            "batch_size": 2048,
            "n_parallel": 32,
            "ctx_size": 2048 * 32,
            "embedding": True,
        },
        "EmbeddingGemma 300M (downloads it)",
    ),
    preset(
        "--fim-qwen-1.5b-default", _fim("1.5B", "qwen2.5-coder-1.5b-q8_0.gguf"), "Qwen 2.5 Coder 1.5B (downloads it)"
    ),
    preset("--fim-qwen-3b-default", _fim("3B", "qwen2.5-coder-3b-q8_0.gguf"), "Qwen 2.5 Coder 3B (downloads it)"),
    preset("--fim-qwen-7b-default", _fim("7B", "qwen2.5-coder-7b-q8_0.gguf"), "Qwen 2.5 Coder 7B (downloads it)"),
    preset(
        "--fim-qwen-7b-spec",
        _fim_spec("7B", "qwen2.5-coder-7b-q8_0.gguf"),
        "Qwen 2.5 Coder 7B + 0.5B draft for speculative decoding (downloads them)",
    ),
    preset(
        "--fim-qwen-14b-spec",
        _fim_spec("14B", "qwen2.5-coder-14b-q8_0.gguf"),
        "Qwen 2.5 Coder 14B + 0.5B draft for speculative decoding (downloads them)",
    ),
    preset(
        "--fim-qwen-30b-default",
        {
            **_FIM,
            "hf_repo": "ggml-org/Qwen3-Coder-30B-A3B-Instruct-Q8_0-GGUF",
            "hf_file": "qwen3-coder-30b-a3b-instruct-q8_0.gguf",
        },
        "Qwen 3 Coder 30B A3B Instruct (downloads it)",
    ),
    preset(
        "--gpt-oss-20b-default",
        {
            **_GPT_OSS,
            "hf_repo": "ggml-org/gpt-oss-20b-GGUF",
            "hf_file": "gpt-oss-20b-mxfp4.gguf",
        },
        "gpt-oss-20b (downloads it)",
    ),
    preset(
        "--gpt-oss-120b-default", {**_GPT_OSS, "hf_repo": "ggml-org/gpt-oss-120b-GGUF"}, "gpt-oss-120b (downloads it)"
    ),
    preset(
        "--vision-gemma-4b-default",
        {"hf_repo": "ggml-org/gemma-3-4b-it-qat-GGUF", "port": 8014, "ctx_size": 0, "jinja": True},
        "Gemma 3 4B QAT with its vision projector (downloads it)",
    ),
    preset(
        "--vision-gemma-12b-default",
        {"hf_repo": "ggml-org/gemma-3-12b-it-qat-GGUF", "port": 8014, "ctx_size": 0, "jinja": True},
        "Gemma 3 12B QAT with its vision projector (downloads it)",
    ),
    preset(
        "--spec-default",
        {
            "spec.default_preset": True,
            "spec.ngram_mod_n_match": 24,
            "spec.ngram_mod_n_min": 48,
            "spec.ngram_mod_n_max": 64,
        },
        "the default speculative decoding settings (ngram-mod)",
    ),
)
