"""How a weight update meets generation in flight (`workflow.weightUpdate`).

`drain`: the update waits until the generation in progress has finished (every
row of an hf batch, every group in flight on vLLM, the tool calls of their
episodes), so each sample comes from one weight version.

`interrupt`: the update stops generation at the next token boundary, loads the
new weights and generation goes on from each row's tokens so far, under the new
weights; an episode waiting on its tool holds nothing, its next turn runs under
whatever weights are loaded then. A sample then carries the version of each of
its tokens as change points (workflow/versions.py): the first (position 0) is the
version it started with, the row's version in the TransferQueue; staleness is
its oldest token's, and every token's version must be within the bound when it
is trained (trainer/lineage.py).

`UpdateGate` is the meeting point. The weight receiver's thread calls
`update(load)`; an engine wraps each stretch of generation in `generating()` and
asks `requested()` between tokens. An update waits for the stretch in progress
to stop, never for a whole generation; a stretch waits while an update is asked
for or loading, so the update is never starved."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class UpdateGate:
    def __init__(self):
        self._cond = threading.Condition()
        self._pending = 0  # updates asked for and not yet loaded
        self._running = 0  # stretches of generation in progress

    def requested(self) -> bool:
        """Whether an update waits: generation stops at its next token boundary."""
        return self._pending > 0

    def update(self, load: Callable[[], None]) -> None:
        """Stop the generation in progress at a token boundary, run `load` (the new
        weights into the engine) and let generation go on."""
        with self._cond:
            self._pending += 1
            try:
                self._cond.wait_for(lambda: self._running == 0)
                load()
            finally:
                self._pending -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """One stretch of generation: it starts when no update waits, and stops
        (the engine's part) at the first token boundary after `requested()`."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()
