"""Reading image, audio and video inputs: the one place every task endpoint gets media from.

Two halves that run in different processes, so this package imports nothing on purpose:

- `sources` and `fetch` run in the gateway (async): they turn a reference (base64, data URI, http(s)
  URL, local path under the media root) into bytes, enforcing size, time and network rules (SSRF).
- `image` and `decode` run in worker processes (plain functions): they turn bytes into a PIL image
  (`image`, PIL alone: vLLM's environment imports it too), mono float32 audio or sampled RGB video
  frames (`decode`), refusing pixel bombs and over-long media.

Importing `modelhost.media.image` or `.decode` in a worker therefore pulls in neither httpx nor the settings.
See docs/media.md for what clients may send.
"""
