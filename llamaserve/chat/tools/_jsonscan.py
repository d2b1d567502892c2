"""A linear-time, incremental JSON syntax checker: the scanner the parsers run on model
text instead of backtracking regular expressions."""

from __future__ import annotations

import json
import re

_WS = " \t\r\n"  # JSON's whitespace, also what the parsers skip between blocks
MORE, DONE, ERROR = 0, 1, 2

(_S_VALUE, _S_OBJ_FIRST, _S_OBJ_KEY, _S_COLON, _S_AFTER, _S_ARR_FIRST, _S_STR, _S_ESC, _S_U, _S_NUM, _S_LIT) = range(11)
_STR_STOP = re.compile(r'["\\\x00-\x1f]')
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")
# number sub-states: 0 after '-', 1 after leading 0, 2 int digits, 3 after '.', 4 frac digits,
# 5 after e, 6 after e sign, 7 exp digits
_NUM_ACCEPT = frozenset((1, 2, 4, 7))


class JsonScanner:
    """A linear-time, incremental syntax checker for one JSON value (RFC 8259).

    ``scan(buf, pos, final)`` consumes as much as it can and returns ``(pos, status)``: DONE with
    ``pos`` just after the value, ERROR with ``pos`` at the offending character (or at the end
    when the text is final but the value incomplete), or MORE when it needs more text.

    One leniency: raw control characters inside strings (models writing code with real
    newlines) are accepted and their positions recorded in ``fixups``, so the caller can escape
    them (:func:`escape_fixups`) and still hand valid JSON to clients.
    """

    __slots__ = ("fixups", "is_key", "lit", "max_depth", "num", "stack", "state", "ucount")

    def __init__(self, max_depth: int = 512) -> None:
        self.fixups: list[int] = []
        self.stack: list[str] = []
        self.state = _S_VALUE
        self.is_key = False
        self.num = 0
        self.lit = ""
        self.ucount = 0
        self.max_depth = max_depth

    def scan(self, buf: str, pos: int, final: bool) -> tuple[int, int]:
        n = len(buf)
        stack = self.stack
        while True:
            st = self.state
            if st == _S_STR:
                m = _STR_STOP.search(buf, pos)
                if m is None:
                    pos = n
                    break
                pos = m.start()
                c = buf[pos]
                if c == '"':
                    pos += 1
                    self.state = _S_COLON if self.is_key else _S_AFTER
                    if self.state == _S_AFTER and not stack:
                        return pos, DONE
                    continue
                if c == "\\":
                    pos += 1
                    self.state = _S_ESC
                    continue
                self.fixups.append(pos)  # a raw control character: escaped by the caller
                pos += 1
                continue
            if pos >= n:
                break
            c = buf[pos]
            if st in (_S_VALUE, _S_OBJ_FIRST, _S_OBJ_KEY, _S_COLON, _S_AFTER, _S_ARR_FIRST):
                if c in _WS:
                    pos += 1
                    continue
                if st == _S_VALUE:
                    if c == "{" or c == "[":
                        if len(stack) >= self.max_depth:
                            return pos, ERROR
                        stack.append(c)
                        self.state = _S_OBJ_FIRST if c == "{" else _S_ARR_FIRST
                        pos += 1
                    elif c == '"':
                        self.is_key = False
                        self.state = _S_STR
                        pos += 1
                    elif c == "-" or c in _DIGITS:
                        self.state = _S_NUM
                        self.num = 0 if c == "-" else (1 if c == "0" else 2)
                        pos += 1
                    elif c in "tfn":
                        self.lit = {"t": "rue", "f": "alse", "n": "ull"}[c]
                        self.state = _S_LIT
                        pos += 1
                    else:
                        return pos, ERROR
                elif st in (_S_OBJ_FIRST, _S_OBJ_KEY):
                    if c == '"':
                        self.is_key = True
                        self.state = _S_STR
                        pos += 1
                    elif c == "}" and st == _S_OBJ_FIRST:
                        stack.pop()
                        pos += 1
                        if not stack:
                            return pos, DONE
                        self.state = _S_AFTER
                    else:
                        return pos, ERROR
                elif st == _S_COLON:
                    if c != ":":
                        return pos, ERROR
                    pos += 1
                    self.state = _S_VALUE
                elif st == _S_ARR_FIRST:
                    if c == "]":
                        stack.pop()
                        pos += 1
                        if not stack:
                            return pos, DONE
                        self.state = _S_AFTER
                    else:
                        self.state = _S_VALUE
                else:  # _S_AFTER, inside a container
                    top = stack[-1]
                    if c == ",":
                        pos += 1
                        self.state = _S_OBJ_KEY if top == "{" else _S_VALUE
                    elif (c == "}" and top == "{") or (c == "]" and top == "["):
                        stack.pop()
                        pos += 1
                        if not stack:
                            return pos, DONE
                    else:
                        return pos, ERROR
            elif st == _S_ESC:
                if c in '"\\/bfnrt':
                    self.state = _S_STR
                elif c == "u":
                    self.state = _S_U
                    self.ucount = 4
                else:
                    return pos, ERROR
                pos += 1
            elif st == _S_U:
                if c not in _HEX:
                    return pos, ERROR
                pos += 1
                self.ucount -= 1
                if self.ucount == 0:
                    self.state = _S_STR
            elif st == _S_NUM:
                k = self.num
                if c in _DIGITS:
                    if k == 0:
                        self.num = 1 if c == "0" else 2
                    elif k == 1:
                        return pos, ERROR  # leading zero
                    elif k == 3:
                        self.num = 4
                    elif k == 5 or k == 6:
                        self.num = 7
                    pos += 1
                elif c == "." and k in (1, 2):
                    self.num = 3
                    pos += 1
                elif c in "eE" and k in (1, 2, 4):
                    self.num = 5
                    pos += 1
                elif c in "+-" and k == 5:
                    self.num = 6
                    pos += 1
                elif k in _NUM_ACCEPT:
                    if not stack:
                        return pos, DONE
                    self.state = _S_AFTER
                else:
                    return pos, ERROR
            elif st == _S_LIT:
                if c != self.lit[0]:
                    return pos, ERROR
                self.lit = self.lit[1:]
                pos += 1
                if not self.lit:
                    if not stack:
                        return pos, DONE
                    self.state = _S_AFTER
        # out of text
        if final:
            if self.state == _S_NUM and self.num in _NUM_ACCEPT and not stack:
                return pos, DONE
            return pos, ERROR
        return pos, MORE


def escape_fixups(buf: str, start: int, end: int, fixups: list[int]) -> str:
    """``buf[start:end]`` with the raw control characters at ``fixups`` JSON-escaped."""
    if not fixups:
        return buf[start:end]
    out = []
    prev = start
    for p in fixups:
        if start <= p < end:
            out.append(buf[prev:p])
            out.append(json.dumps(buf[p])[1:-1])
            prev = p + 1
    out.append(buf[prev:end])
    return "".join(out)
