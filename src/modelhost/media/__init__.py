"""Reading image, audio and video inputs: the one place every task endpoint gets media from.

Two halves that run in different processes, so this package imports nothing on purpose:

- `sources` and `fetch` run in the gateway (async): they turn a reference (base64, data URI, http(s)
  URL, local path under the media root) into bytes, enforcing size, time and network rules (SSRF).
- `decode` runs in worker processes (plain functions): it turns bytes into a PIL image, mono float32
  audio or sampled RGB video frames, refusing pixel bombs and over-long media.

Importing `modelhost.media.decode` in a worker therefore pulls in neither httpx nor the settings.
See docs/media.md for what clients may send.
"""
