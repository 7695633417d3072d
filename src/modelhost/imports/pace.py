"""How long an import may hold its slot: a deadline on the whole fetch and a minimum rate while it
downloads, so that a source that trickles (a byte every 20 s keeps an idle timeout content) fails
rather than keeps other accounts' imports `queued`.

The runner's beat asks `Pace.check` every second or so, rather than each read checking its own pace:
a read blocked in a thread (boto3 waits for a whole chunk) is caught all the same, and the check
costs nothing per chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from modelhost.config import Settings
from modelhost.imports.sources import ImportFailed


class Pace:
    """One run of one import, from its start: `check` says why it must stop, if it must.

    - Past `import_deadline_seconds` since the run began: `deadline_exceeded`.
    - While downloads are in flight, the bytes received are measured over windows of
      `import_rate_window_seconds`, one after the other: a window whose rate is under
      `import_min_bytes_per_second` fails with `source_too_slow`. A window starts with the first check
      that finds downloads in flight and is dropped when none are (listing and unpacking are bounded by
      their own deadline and the archive bounds), so no window mixes a download with a pause.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._deadline = settings.import_deadline_seconds
        self._minimum = settings.import_min_bytes_per_second
        self._window = settings.import_rate_window_seconds
        self._clock = clock
        self._started = clock()
        self._since: tuple[float, int] | None = None  # (start, bytes done then) of the current window

    def check(self, done: int, downloading: int) -> ImportFailed | None:
        """`done`: the import's bytes received so far; `downloading`: its downloads in flight."""
        now = self._clock()
        if now - self._started > self._deadline:
            return ImportFailed(
                "deadline_exceeded",
                f"Still fetching after {self._deadline:g} s (MODELHOST_IMPORT_DEADLINE_SECONDS).",
            )
        if not downloading or not self._minimum:
            self._since = None
            return None
        if self._since is None:
            self._since = (now, done)
            return None
        start, done_then = self._since
        if now - start < self._window:
            return None
        rate = (done - done_then) / (now - start)
        if rate < self._minimum:
            return ImportFailed(
                "source_too_slow",
                f"The source sent {int(rate)} bytes/s over the last {now - start:.0f} s, under the minimum "
                f"of {self._minimum} (MODELHOST_IMPORT_MIN_BYTES_PER_SECOND).",
            )
        self._since = (now, done)
        return None
