"""Numeric ranges as grammars over canonical decimal text (integer and decimal bounds)."""

from __future__ import annotations

from decimal import Decimal
from typing import Final, TypeAlias

from llamaserve.grammar.gbnf import _gbnf_class, _group, _iv, _rep_suffix, _seq

# --------------------------------------------------------------------------------------------
# Numeric ranges as grammars over canonical decimal text.


def _digit_class(lo: int, hi: int) -> str:
    return f'"{lo}"' if lo == hi else f"[{lo}-{hi}]"


def _same_length_range(lo: str, hi: str) -> str:
    """Digit strings of len(lo) (leading zeros allowed) between ``lo`` and ``hi`` inclusive."""
    if lo == hi:
        return f'"{lo}"'
    p = 0
    while lo[p] == hi[p]:
        p += 1
    if p:
        return _seq(f'"{lo[:p]}"', _group(_same_length_range(lo[p:], hi[p:])))
    rest = len(lo) - 1
    if rest == 0:
        return _digit_class(int(lo), int(hi))
    any_rest = "[0-9]" if rest == 1 else f"[0-9]{{{rest}}}"
    lo_full = lo[1:] == "0" * rest
    hi_full = hi[1:] == "9" * rest
    first = int(lo[0]) if lo_full else int(lo[0]) + 1
    last = int(hi[0]) if hi_full else int(hi[0]) - 1
    alts = []
    if not lo_full:
        alts.append(_seq(f'"{lo[0]}"', _group(_same_length_range(lo[1:], "9" * rest))))
    if first <= last:
        alts.append(_seq(_digit_class(first, last), any_rest))
    if not hi_full:
        alts.append(_seq(f'"{hi[0]}"', _group(_same_length_range("0" * rest, hi[1:]))))
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _nonneg_int_alts(a: int, b: int | None) -> list[str]:
    """Alternatives for the canonical decimal form of every integer in [a, b] (b None = inf)."""
    if b is not None and a > b:
        return []
    alts: list[str] = []
    if a == 0:
        alts.append('"0"')
        if b == 0:
            return alts
        a = 1
    da = len(str(a))
    if b is None:
        alts.append(_same_length_range(str(a), "9" * da))
        # Longer numbers are all larger; offer up to 16 digits (or one more than the bound).
        alts.append(_seq("[1-9]", "[0-9]" + _rep_suffix(da, max(da, 15))))
        return alts
    db = len(str(b))
    for d in range(da, db + 1):
        lo_s = str(a) if d == da else "1" + "0" * (d - 1)
        hi_s = str(b) if d == db else "9" * d
        alts.append(_same_length_range(lo_s, hi_s))
    return alts


def _int_range_alts(lo: int | None, hi: int | None) -> list[str]:
    alts: list[str] = []
    if hi is None or hi >= 0:
        alts += _nonneg_int_alts(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        # Negative numbers: "-" and a magnitude; "-0" is never produced.
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = None if lo is None else -lo
        alts += [_seq('"-"', _group(a)) for a in _nonneg_int_alts(mag_lo, mag_hi)]
    return alts


# Fraction-digit constraints: ("free",), ("ge"|"gt", digits) for a lower bound on 0.F,
# ("le"|"lt", digits) for an upper bound. Bound digits never have trailing zeros.
_FracState: TypeAlias = tuple[str, ...]
_FREE: Final[_FracState] = ("free",)


def _frac_step(state: _FracState, d: int, lower: bool) -> _FracState | None:
    if state == _FREE:
        return state
    kind, digits = state
    b = int(digits[0]) if digits else 0
    if d == b:
        nxt = (kind, digits[1:])
        return _FREE if nxt == ("ge", "") else nxt
    return _FREE if (d > b) == lower else None


def _digits_upto(n: int) -> str:
    """GBNF for 0..n decimal digits."""
    return "" if n <= 0 else "[0-9]?" if n == 1 else f"[0-9]{{0,{n}}}"


def _frac_lang(lo: _FracState, hi: _FracState, budget: int) -> tuple[bool, str | None]:
    """Fraction digit strings F of at most ``budget`` digits with 0.F within the bounds.

    Returns (whether the empty F -- i.e. no fraction part -- is allowed, GBNF for the non-empty
    F or None). The budget only narrows the language (see _SIGNIFICANT_DIGITS).
    """
    if lo == ("ge", ""):
        lo = _FREE
    if hi == ("lt", "") or (lo == ("gt", "") and hi == ("le", "")):
        return False, None
    empty_ok = lo == _FREE  # 0.F >= 0.s with s non-empty, or > anything, fails for empty F
    if budget <= 0:
        return empty_ok, None
    if lo == _FREE and hi == _FREE:
        return True, _seq("[0-9]", _digits_upto(budget - 1))
    if lo == ("gt", "") and hi == _FREE:
        # Some non-zero digit within the budget: first non-zero digit at each possible place.
        alts = [_seq("[1-9]", _digits_upto(budget - 1))]
        inner = _frac_lang(lo, hi, budget - 1)[1]
        if inner is not None:
            alts.append(_seq('"0"', _group(inner)))
        return False, " | ".join(alts)
    if lo == _FREE and hi == ("le", ""):
        return True, '"0"' + _rep_suffix(1, budget)
    groups: dict[tuple[_FracState, _FracState], list[int]] = {}
    for d in range(10):
        nl, nh = _frac_step(lo, d, True), _frac_step(hi, d, False)
        if nl is not None and nh is not None:
            groups.setdefault((nl, nh), []).append(d)
    alts = []
    for (nl, nh), digits in groups.items():
        cls = _gbnf_class(_iv((d + 0x30, d + 0x30) for d in digits))
        rest_empty, rest = _frac_lang(nl, nh, budget - 1)
        if rest is None:
            if rest_empty:
                alts.append(cls)
        elif rest_empty:
            alts.append(f"{cls} ({rest})?" if " " in rest else f"{cls} {rest}?")
        else:
            alts.append(_seq(cls, _group(rest)))
    return empty_ok, (" | ".join(alts) if alts else None)


def _split_decimal(d: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits (no trailing zeros) of a non-negative decimal."""
    ip = int(d)
    text = format(d - ip, "f")
    return ip, text.partition(".")[2].rstrip("0")


# Bounded numbers are written with at most this many digits (integer digits plus fraction
# digits). Consumers parse JSON numbers as IEEE doubles, and decimals of up to 15 significant
# digits convert to distinct, correctly ordered doubles; with more digits "0.50000000000000002"
# would be > 0.5 as text but == 0.5 once parsed, breaking an exclusiveMinimum of 0.5.
_SIGNIFICANT_DIGITS: Final = 15


def _int_alts_by_length(a: int, b: int | None, max_len: int) -> list[tuple[int, str]]:
    """(digit count, GBNF) for the integers in [a, b] with at most ``max_len`` digits, one
    alternative per length; "0" counts as 0 digits (it adds nothing significant)."""
    out: list[tuple[int, str]] = []
    if b is not None and a > b:
        return out
    if a == 0:
        out.append((0, '"0"'))
        if b == 0:
            return out
        a = 1
    da = len(str(a))
    db = min(len(str(b)), max_len) if b is not None else max_len
    for d in range(da, db + 1):
        lo_s = str(a) if d == da else "1" + "0" * (d - 1)
        hi_s = str(b) if b is not None and d == len(str(b)) else "9" * d
        out.append((d, _same_length_range(lo_s, hi_s)))
    return out


def _nonneg_number_alts(a: Decimal, a_excl: bool, b: Decimal | None, b_excl: bool) -> list[str]:
    """Alternatives for non-negative decimals v (no exponent) with a <(=) v <(=) b."""
    ai, af = _split_decimal(a)
    lo_state: _FracState = ("gt" if a_excl else "ge", af)

    def budget(int_part: int) -> int:
        return _SIGNIFICANT_DIGITS - (len(str(int_part)) if int_part else 0)

    def with_fraction(int_part: int, lo: _FracState, hi: _FracState) -> str | None:
        if budget(int_part) < 0:
            return None
        empty_ok, frac = _frac_lang(lo, hi, budget(int_part))
        if frac is None:
            return f'"{int_part}"' if empty_ok else None
        tail = f'"." {_group(frac)}'
        return _seq(f'"{int_part}"', f"({tail})?" if empty_ok else tail)

    def any_fraction(length: int) -> str:
        room = _SIGNIFICANT_DIGITS - length
        return "" if room <= 0 else f'("." {_seq("[0-9]", _digits_upto(room - 1))})?'

    alts: list[str | None] = []
    bi, bf = _split_decimal(b) if b is not None else (None, "")
    if bi is not None and ai == bi:
        alts.append(with_fraction(ai, lo_state, ("lt" if b_excl else "le", bf)))
    else:
        alts.append(with_fraction(ai, lo_state, _FREE))
        upper = None if bi is None else bi - 1
        for length, expr in _int_alts_by_length(ai + 1, upper, _SIGNIFICANT_DIGITS):
            alts.append(_seq(_group(expr), any_fraction(length)))
        if bi is not None:
            alts.append(with_fraction(bi, _FREE, ("lt" if b_excl else "le", bf)))
    return [x for x in alts if x is not None]


def _number_range_alts(lo: Decimal | None, lo_excl: bool, hi: Decimal | None, hi_excl: bool) -> list[str]:
    alts: list[str] = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        a, a_excl = (Decimal(0), False) if lo is None or lo < 0 else (lo, lo_excl)
        alts += _nonneg_number_alts(a, a_excl, hi, hi_excl)
    if lo is None or lo < 0:
        # v < 0 is "-" followed by a magnitude m = -v > 0.
        m_lo, m_lo_excl = (Decimal(0), True) if hi is None or hi >= 0 else (-hi, hi_excl)
        m_hi, m_hi_excl = (None, False) if lo is None else (-lo, lo_excl)
        magnitudes = _nonneg_number_alts(m_lo, m_lo_excl, m_hi, m_hi_excl)
        alts += [_seq('"-"', _group(x)) for x in magnitudes]
    return alts
