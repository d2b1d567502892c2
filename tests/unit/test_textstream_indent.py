"""n_indent: the text ends before the first line, after a newline, indented less than asked."""

from __future__ import annotations

import random

from llamaserve.engine.textstream import TextStream


def shallow_line_start(text: str, min_indent: int) -> int:
    """Where llama-server cuts ``text``: after the indentation (spaces, tabs) of the first line,
    after the first newline, indented less than ``min_indent``, a blank line included; -1: nowhere."""
    start = text.find("\n") + 1
    while start > 0:
        pos = start
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and pos - start < min_indent:
            return pos
        start = text.find("\n", start) + 1
    return -1


def feed(stream: TextStream, pieces: list[str]) -> str:
    emitted = ""
    for piece in pieces:
        emitted += stream.push(piece.encode())
        if stream.indent_stopped:
            break
    return emitted + stream.flush()


def test_a_shallow_line_ends_the_text_before_its_first_character() -> None:
    stream = TextStream(min_indent=4)
    text = feed(stream, ["x = 1  # the cursor's line is not checked", "\n    y = 2", "\n  z", " = 3\n"])
    assert stream.indent_stopped
    assert text == "x = 1  # the cursor's line is not checked\n    y = 2\n  "


def test_deep_enough_lines_go_on_and_a_blank_line_ends_them() -> None:
    stream = TextStream(min_indent=2)
    pieces = ["a\n", "  b\n", "\t\tc\n"]
    assert feed(stream, pieces) == "".join(pieces)
    assert not stream.indent_stopped
    stream = TextStream(min_indent=2)
    assert feed(stream, ["a\n  b\n", " \n", "  c\n"]) == "a\n  b\n "
    assert stream.indent_stopped


def test_random_pieces_cut_where_llama_server_cuts() -> None:
    rng = random.Random(3)
    for _ in range(3000):
        source = "".join(rng.choice("ab \t\n") for _ in range(rng.randrange(0, 30)))
        cut = rng.randrange(0, len(source) + 1)
        pieces = [source[:cut], source[cut:]] if rng.random() < 0.5 else list(source)
        min_indent = rng.randrange(1, 4)
        stream = TextStream(("zz",), min_indent)  # a stop string that never matches: the held-text path
        emitted = feed(stream, pieces)
        at = shallow_line_start(source, min_indent)
        assert stream.indent_stopped == (at >= 0)
        assert emitted == (source[:at] if at >= 0 else source)
