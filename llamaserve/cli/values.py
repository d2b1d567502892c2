"""Value checks for flag arguments: each turns the text after a flag into a typed value or raises ValueError.

They mirror what llama-server accepts, so a value it refuses is refused here at start, with the flag named
by the caller, rather than failing later inside llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable

TRUE_WORDS = frozenset({"1", "true", "on", "enabled", "yes"})
FALSE_WORDS = frozenset({"0", "false", "off", "disabled", "no"})

# llama.cpp's KV cache types, as `-ctk/-ctv` accept them.
KV_CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ValueError(f"expected a boolean, got '{text}'")


def integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got '{text}'") from None


def number(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got '{text}'") from None


def layers(text: str) -> int:
    """`-ngl`: a count, `auto` (-1) or `all` (-2), as llama-server reads them."""
    low = text.strip().lower()
    if low == "auto":
        return -1
    if low == "all":
        return -2
    return integer(text)


def choice(*allowed: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        low = text.strip().lower()
        if low not in allowed:
            raise ValueError(f"'{text}' is not one of {', '.join(allowed)}")
        return low

    return check


def zero_or_one(text: str) -> bool:
    """`--cpu-strict <0|1>` and friends."""
    value = integer(text)
    if value not in (0, 1):
        raise ValueError("expected 0 or 1")
    return bool(value)


def poll_level(text: str) -> int:
    value = integer(text)
    if not 0 <= value <= 100:
        raise ValueError("expected a polling level from 0 to 100")
    return value


def priority(text: str) -> int:
    """`--prio`: low (-1), normal (0), medium (1), high (2), realtime (3)."""
    value = integer(text)
    if not -1 <= value <= 3:
        raise ValueError("expected a priority from -1 (low) to 3 (realtime)")
    return value


def cpu_mask(text: str) -> str:
    """`-C`: an arbitrarily long hex mask, `0x` optional."""
    digits = text.strip().lower().removeprefix("0x")
    if not digits or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"invalid cpumask '{text}'")
    return digits


def cpu_range(text: str) -> str:
    """`-Cr lo-hi` (either end may be left out)."""
    lo, sep, hi = text.strip().partition("-")
    try:
        start = int(lo) if lo else 0
        end = int(hi) if hi else start if not sep else 511
    except ValueError:
        raise ValueError(f"invalid range '{text}'") from None
    if start < 0 or end < start or end > 511:
        raise ValueError(f"invalid range '{text}'")
    return f"{start}-{end}"


def fractions(text: str) -> tuple[float, ...]:
    """`-ts 3,1`: proportions per device (',' or '/' between them, as llama-server allows)."""
    parts = [p for p in text.replace("/", ",").split(",") if p.strip()]
    if not parts:
        raise ValueError("expected a comma-separated list of proportions")
    values = tuple(number(p) for p in parts)
    if any(v < 0 for v in values):
        raise ValueError("proportions must not be negative")
    return values


def mib_list(text: str) -> tuple[int, ...]:
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("expected a comma-separated list of MiB values")
    return tuple(integer(p) for p in parts)


def kv_cache_type(text: str) -> str:
    return choice(*KV_CACHE_TYPES)(text)


def fit_switch(text: str) -> bool:
    low = text.strip().lower()
    if low not in ("on", "off"):
        raise ValueError("expected 'on' or 'off'")
    return low == "on"


def tri_state(text: str) -> str:
    """`on`, `off` or `auto` (the boolean words count too, as llama-server reads them)."""
    low = text.strip().lower()
    if low in ("auto", "-1"):
        return "auto"
    if low in TRUE_WORDS:
        return "on"
    if low in FALSE_WORDS:
        return "off"
    raise ValueError(f"expected on, off or auto, got '{text}'")


def port(text: str) -> int:
    value = integer(text)
    if not 0 < value < 65536:
        raise ValueError("expected a port from 1 to 65535")
    return value


def nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a value")
    return text


def int_within(lo: int, hi: int, what: str) -> Callable[[str], int]:
    """An integer in [lo, hi]; llama-server's message names the knob."""

    def check(text: str) -> int:
        value = integer(text)
        if not lo <= value <= hi:
            raise ValueError(f"{what} must be between {lo} and {hi} inclusive")
        return value

    return check


def non_negative(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise ValueError("invalid value")
    return value


def numbers(text: str) -> tuple[float, ...]:
    """`P0,P1,...`: comma-separated numbers."""
    return tuple(number(part) for part in text.split(","))


def spec_types(text: str) -> tuple[str, ...]:
    from llamaserve.engine.spec_params import parse_types

    return parse_types(text)


def min_hits(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise ValueError("ngram min hits must be at least 1")
    return value
