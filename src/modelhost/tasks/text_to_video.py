"""Text-to-video generation inside a replica worker, for the durable video jobs (api.md §4.2).

A job takes many seconds to minutes, so this is a streaming handler: the diffusers pipeline runs in a
thread of the worker, its per-step callback reports progress (and stops the run when the job is
cancelled), and the worker's loop sends the events back as they come. The finished frames are encoded
here, next to the model, to the MP4 and its two previews (a WebP thumbnail, a JPEG spritesheet); the
three files travel back in the last event.

With an `input_reference`, a TextToVideoSD model generates video-to-video from it (the reference's
frames, an image being a still video); models that cannot take a reference fail the job with
`input_reference_unsupported`.
"""

from __future__ import annotations

import inspect
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modelhost.engines import loader
from modelhost.engines.interface import Event
from modelhost.errors import InvalidRequest
from modelhost.generation.contract import Progress, StreamRequest, VideoDone, VideoRequest, failed
from modelhost.media.encode import encode_mp4, encode_spritesheet, encode_thumbnail


class _Cancelled(Exception):
    pass


@dataclass
class _Job:
    id: int
    request: VideoRequest
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class VideoModel:
    pipeline: Any
    device: str
    waiting: deque[_Job] = field(default_factory=deque)
    running: _Job | None = None
    events: queue.Queue[tuple[int, Event]] = field(default_factory=queue.Queue)


class TextToVideo:
    streaming = True

    def load(self, model_dir: Path, device: str) -> VideoModel:
        return VideoModel(loader.load_diffusers(model_dir, device, "DiffusionPipeline"), device)

    def warmup(self, state: VideoModel) -> None:
        """Nothing: a warm-up video would cost as much as a real one."""

    def start(self, state: VideoModel, request_id: int, request: StreamRequest) -> None:
        if not isinstance(request, VideoRequest):
            raise InvalidRequest("A text-to-video deployment makes videos (POST /v1/videos).", param="model")
        _check_size(state.pipeline, request.width, request.height, request.frames)
        state.waiting.append(_Job(request_id, request))

    def cancel(self, state: VideoModel, request_id: int) -> None:
        state.waiting = deque(j for j in state.waiting if j.id != request_id)
        if state.running is not None and state.running.id == request_id:
            state.running.cancelled.set()

    def step(self, state: VideoModel) -> list[tuple[int, Event]]:
        """Start the next job when none runs; then the events that arrived (waiting briefly for one)."""
        if state.running is None and state.waiting:
            job = state.running = state.waiting.popleft()
            threading.Thread(target=self._run, args=(state, job), daemon=True).start()
        events: list[tuple[int, Event]] = []
        try:
            events.append(state.events.get(timeout=0.2))
            while True:
                events.append(state.events.get_nowait())
        except queue.Empty:
            pass
        return events

    def idle(self, state: VideoModel) -> bool:
        return state.running is None and not state.waiting and state.events.empty()

    def running(self, state: VideoModel) -> int:
        return len(state.waiting) + (state.running is not None)

    def cache_usage(self, state: VideoModel) -> None:
        return None  # a diffusion pipeline keeps no KV cache between requests

    def handoff(self, state: VideoModel) -> list[int] | None:
        """A video job has no continuation: it runs to its end."""
        return None

    def abort(self, state: VideoModel) -> list[int]:
        jobs = [*state.waiting, *([state.running] if state.running else [])]
        for job in jobs:
            job.cancelled.set()
        state.waiting.clear()
        return [job.id for job in jobs]

    def _run(self, state: VideoModel, job: _Job) -> None:
        try:
            frames = _generate(state, job)
            state.events.put((job.id, Progress(99)))
            finished = VideoDone(
                video=encode_mp4(frames, job.request.fps),
                thumbnail=encode_thumbnail(frames),
                spritesheet=encode_spritesheet(frames),
                frames=int(frames.shape[0]),
            )
            state.events.put((job.id, finished))
        except _Cancelled:
            pass
        except Exception as exc:
            code = "out_of_memory" if "OutOfMemory" in type(exc).__name__ else "generation_error"
            if isinstance(exc, InvalidRequest):
                code = exc.code
            message = exc.message if isinstance(exc, InvalidRequest) else f"{type(exc).__name__}: {exc}"
            state.events.put((job.id, failed(message, code=code)))
        finally:
            state.running = None


def _generate(state: VideoModel, job: _Job) -> np.ndarray:
    import torch

    request = job.request
    pipeline = state.pipeline
    steps = request.num_inference_steps or 25
    options: dict[str, Any] = {
        "prompt": request.prompt,
        "num_inference_steps": steps,
        "height": request.height,
        "width": request.width,
        "output_type": "np",
    }
    if request.guidance_scale is not None:
        options["guidance_scale"] = float(request.guidance_scale)
    if request.seed is not None:
        options["generator"] = torch.Generator(state.device).manual_seed(request.seed)
    if request.reference is not None:
        pipeline, options = _with_reference(pipeline, options, request)
    else:
        options["num_frames"] = request.frames

    def progress(step: int) -> None:
        if job.cancelled.is_set():
            raise _Cancelled
        state.events.put((job.id, Progress(min(98, int(100 * (step + 1) / steps)))))

    def on_step_end(_pipeline: Any, step: int, _timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        progress(step)
        return tensors

    parameters = inspect.signature(pipeline.__call__).parameters
    if "callback_on_step_end" in parameters:
        options["callback_on_step_end"] = on_step_end
    elif "callback" in parameters:  # older pipelines (TextToVideoSD)
        options.update(callback=lambda step, _t, _latents: progress(step), callback_steps=1)
    frames = np.asarray(pipeline(**options).frames[0], dtype=np.float32)
    pixels: np.ndarray = (np.clip(frames, 0.0, 1.0) * 255).round().astype(np.uint8)
    return pixels


def _with_reference(
    pipeline: Any, options: dict[str, Any], request: VideoRequest
) -> tuple[Any, dict[str, Any]]:
    from diffusers import TextToVideoSDPipeline, VideoToVideoSDPipeline

    from modelhost.media.decode import reference_frames

    if not isinstance(pipeline, TextToVideoSDPipeline):
        raise InvalidRequest(
            f"This model ({type(pipeline).__name__}) cannot take an input_reference.",
            code="input_reference_unsupported",
        )
    height, width, count = options.pop("height"), options.pop("width"), request.frames
    limits = request.limits
    assert request.reference is not None
    frames = reference_frames(
        request.reference,
        count=count,
        width=width,
        height=height,
        max_pixels=limits.max_pixels,
        max_seconds=limits.max_seconds,
        param="input_reference",
    )
    options.update(video=[frame.astype(np.float32) / 255 for frame in frames], strength=0.7)
    return VideoToVideoSDPipeline.from_pipe(pipeline), options


def _check_size(pipeline: Any, width: int, height: int, frames: int) -> None:
    """What the model's latent grid allows; a job that asks for more fails with `invalid_size`."""
    spatial = int(
        getattr(pipeline, "vae_scale_factor_spatial", 0) or getattr(pipeline, "vae_scale_factor", 8)
    )
    multiple = spatial * 2 if "Wan" in type(pipeline).__name__ else spatial
    if width % multiple or height % multiple:
        raise InvalidRequest(
            f"This model needs a width and height divisible by {multiple}; {width}x{height} is not.",
            code="invalid_size",
        )
    temporal = int(getattr(pipeline, "vae_scale_factor_temporal", 1) or 1)
    if temporal > 1 and (frames - 1) % temporal:
        raise InvalidRequest(
            f"This model makes 1 + {temporal}·k frames; seconds × fps = {frames} is not such a count.",
            code="invalid_size",
        )
