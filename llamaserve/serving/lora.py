"""LoRA scales as the API sees them: the global set and a request's `lora` field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamaserve.errors import APIError


@dataclass
class LoraScales:
    """The loaded adapters' paths and their global scales (POST /lora-adapters sets them)."""

    paths: list[str] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)

    def to_json(self) -> list[dict[str, Any]]:
        return [{"id": i, "path": p, "scale": s} for i, (p, s) in enumerate(zip(self.paths, self.scales))]

    def parse(self, entries: Any) -> list[float]:
        """`[{"id": 0, "scale": 0.5}, ...]` → a scale per adapter; adapters not listed get 0, as in llama-server."""
        if not isinstance(entries, list):
            raise APIError('\'lora\' must be a list of {"id", "scale"} objects')
        scales = [0.0] * len(self.paths)
        for entry in entries:
            if not isinstance(entry, dict) or "id" not in entry or "scale" not in entry:
                raise APIError("each 'lora' entry needs an 'id' and a 'scale'")
            lid, scale = entry["id"], entry["scale"]
            if not isinstance(lid, int) or isinstance(lid, bool) or not 0 <= lid < len(self.paths):
                raise APIError(f"invalid LoRA adapter id {lid!r}: {len(self.paths)} adapter(s) are loaded")
            if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale != scale or abs(scale) > 100:
                raise APIError(f"invalid scale for LoRA adapter {lid}: a number between -100 and 100")
            scales[lid] = float(scale)
        return scales

    def for_request(self, entries: Any | None) -> tuple[float, ...]:
        """The scales a request runs with: its own `lora`, else the global ones."""
        scales = self.scales if entries is None else self.parse(entries)
        return active_scales(scales)


def active_scales(scales: list[float]) -> tuple[float, ...]:
    """() when every scale is 0, so the base model's requests all look alike and batch together."""
    return tuple(scales) if any(s != 0.0 for s in scales) else ()


def from_config(lora: tuple[tuple[str, float], ...], init_without_apply: bool) -> LoraScales:
    return LoraScales([p for p, _ in lora], [0.0 if init_without_apply else s for _, s in lora])
