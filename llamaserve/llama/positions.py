"""Where a KV sequence's tokens sit when media take fewer positions than tokens (M-RoPE).

The engine numbers a sequence's cells 0, 1, 2, ... (one per token, media placeholders
included) and hands those numbers to the runner as positions. With an M-RoPE projector
(the Qwen2-VL family) an image of n_tokens embeddings takes only n_pos positions (the
larger side of its grid, every embedding at the image's first position in the time
section), so the text after it starts n_tokens - n_pos earlier than its cell number, as
llama-server's ``server_tokens::pos_next`` counts. `MediaPositions` keeps, per sequence,
the media runs decoded into it and turns cell numbers into model positions for the runner's
decodes and KV removals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llamaserve.engine.backend import media_slot


@dataclass(frozen=True)
class MediaRun:
    start: int  # the cell of the media's first embedding
    n_tokens: int
    n_pos: int


class MediaPositions:
    def __init__(self) -> None:
        self._runs: dict[int, list[MediaRun]] = {}

    def position(self, seq_id: int, cell: int) -> int:
        """The model position of a cell; a cell inside a media run: the run's first position."""
        shift = 0
        for run in self._runs.get(seq_id, ()):
            if run.start >= cell:
                break
            if cell < run.start + run.n_tokens:
                return run.start - shift
            shift += run.n_tokens - run.n_pos
        return cell - shift

    def note(self, seq_id: int, start: int, n_tokens: int, n_pos: int) -> None:
        """A media run begins at cell ``start``; whatever the sequence held from there is gone."""
        self.forget(seq_id, start)
        self._runs.setdefault(seq_id, []).append(MediaRun(start, n_tokens, n_pos))

    def forget(self, seq_id: int, cell: int) -> None:
        """The sequence's cells from ``cell`` on were removed."""
        runs = self._runs.get(seq_id)
        if runs and runs[-1].start >= cell:
            self._runs[seq_id] = [run for run in runs if run.start < cell]

    def copy(self, src: int, dst: int) -> None:
        self._runs[dst] = list(self._runs.get(src, ()))

    def rebuild(self, seq_id: int, tokens: list[int], shape: Callable[[int], tuple[int, int] | None]) -> int:
        """The runs of a sequence restored with these tokens (a host-cache or file state);
        returns how many leading tokens are accounted for (up to a media of unknown shape)."""
        runs: list[MediaRun] = []
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token >= 0:
                i += 1
                continue
            known = shape(token)
            if known is None or media_slot(token)[1] != 0:
                break
            runs.append(MediaRun(i, known[0], known[1]))
            i += known[0]
        self._runs[seq_id] = runs
        return min(i, len(tokens))
