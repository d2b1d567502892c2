"""Read-only views: /props, /v1/models, /slots — llama-server's JSON shapes."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from llamaserve.engine.sampling import SamplingParams
from llamaserve.engine.views import SlotView
from llamaserve.serving.runtime import ModelRuntime


def spec_types(rt: ModelRuntime) -> str:
    """The speculative decoding types in use, as llama-server names them ("none" when off)."""
    return rt.engine.spec_types


def sampling_params_json(
    cfg: SamplingParams, *, n_predict: int, n_keep: int = 0, stream: bool = False, speculative: str = "none"
) -> dict[str, Any]:
    d = asdict(cfg)
    for key in ("logit_bias", "grammar", "dry_sequence_breakers", "samplers"):
        d.pop(key, None)
    d.update(
        {
            "seed": cfg.seed if cfg.seed >= 0 else 4294967295,
            "max_tokens": n_predict,
            "n_predict": n_predict,
            "n_keep": n_keep,
            "n_discard": 0,
            "stream": stream,
            "samplers": list(cfg.samplers),
            "speculative.types": speculative,
            "timings_per_token": False,
            "post_sampling_probs": False,
            "lora": [],
        }
    )
    return d


def props(rt: ModelRuntime) -> dict[str, Any]:
    cfg = rt.config
    return {
        "default_generation_settings": {
            "params": sampling_params_json(
                cfg.sampling, n_predict=cfg.n_predict, n_keep=cfg.n_keep, speculative=spec_types(rt)
            ),
            "n_ctx": rt.n_ctx_slot,
        },
        "total_slots": rt.engine.n_slots,
        "model_alias": rt.alias,
        "model_ftype": rt.info.ftype,
        "model_path": rt.info.path,
        "modalities": rt.modalities,
        "media_marker": rt.media.marker if rt.media is not None else "",
        "endpoint_slots": cfg.endpoint_slots,
        "endpoint_props": cfg.endpoint_props,
        "endpoint_metrics": cfg.endpoint_metrics,
        "ui": cfg.webui,
        "ui_settings": rt.ui_settings,
        "chat_template": rt.template_source,
        "chat_template_caps": {},
        "bos_token": rt.model.token_text(rt.model.bos) if rt.model.bos >= 0 else "",
        "eos_token": rt.model.token_text(rt.model.eos) if rt.model.eos >= 0 else "",
        "build_info": rt.build_info,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
        # Ours: whether requests sharing a prompt prefix share its KV cells across slots, and
        # if not, why (a split KV, a sliding-window or recurrent model, the flag).
        "prefix_sharing": not rt.engine.prefix_sharing_note,
        "prefix_sharing_note": rt.engine.prefix_sharing_note,
    }


def models(rt: ModelRuntime) -> dict[str, Any]:
    info = rt.info
    name = rt.alias
    return {
        "models": [
            {
                "name": name,
                "model": name,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": ["completion", "multimodal"] if rt.media is not None else ["completion"],
                "parameters": "",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "",
                    "families": [""],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
        ],
        "object": "list",
        "data": [
            {
                "id": name,
                # Every alias, the id among them, as llama-server lists them.
                "aliases": list(rt.config.alias) or [name],
                "tags": sorted(set(rt.config.tags)),  # llama-server keeps them in a std::set
                "object": "model",
                "created": rt.created,
                "owned_by": "llamacpp",
                "architecture": {
                    "input_modalities": ["text"]
                    + (["image"] if rt.modalities["vision"] else [])
                    + (["audio"] if rt.modalities["audio"] else []),
                    "output_modalities": ["text"],
                },
                "meta": {
                    "vocab_type": info.vocab_type,
                    "n_vocab": info.n_vocab,
                    "n_ctx": rt.n_ctx_slot,
                    "n_ctx_train": info.n_ctx_train,
                    "n_embd": info.n_embd,
                    "n_params": info.n_params,
                    "size": info.size_bytes,
                    "ftype": info.ftype,
                },
            }
        ],
    }


def slot_json(rt: ModelRuntime, slot: SlotView) -> dict[str, Any]:
    # An idle slot shows the server's defaults, as llama-server's does.
    cfg = slot.sampling if slot.sampling is not None else rt.config.sampling
    n_predict = slot.n_predict if slot.n_predict is not None else rt.config.n_predict
    out: dict[str, Any] = {
        "id": slot.id,
        "n_ctx": slot.n_ctx,
        "speculative": rt.engine.speculative,
        "is_processing": slot.busy,
    }
    if slot.last_task_id >= 0:
        n_prompt = slot.n_prompt
        out.update(
            {
                "id_task": slot.last_task_id,
                "n_prompt_tokens": n_prompt,
                "n_prompt_tokens_processed": max(0, min(slot.n_past, n_prompt) - slot.n_cached),
                "n_prompt_tokens_cache": slot.n_cached,
                # Ours: of those, the tokens whose cells the slot shares with another sequence.
                "n_prompt_tokens_shared": slot.n_shared,
                "params": sampling_params_json(cfg, n_predict=n_predict, speculative=spec_types(rt)),
                # An idle slot has no budget: the finished task's counts are not the slot's
                # (llama-server resets them when the slot is released).
                "next_token": [
                    {
                        "has_next_token": slot.busy,
                        "has_new_line": slot.has_new_line,
                        "n_remain": (n_predict - slot.n_generated) if slot.busy and n_predict >= 0 else -1,
                        "n_decoded": slot.n_generated if slot.busy else 0,
                    }
                ],
            }
        )
    return out


def slots(rt: ModelRuntime) -> list[dict[str, Any]]:
    return [slot_json(rt, s) for s in rt.engine.slots()]
