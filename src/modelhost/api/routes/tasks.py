"""Hugging Face-style task endpoints (api.md §4.1, §4.4–§4.11): parse → fetch media → worker → shape.

Every route: pick the deployment (routing decides "Endpoint not supported" before any work), read
media references into bytes (base64, data URIs, URLs, local paths: `modelhost.media`), send one item
to the deployment's replica (which batches it), and answer a single result for a single input or a
list for a list.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute

from modelhost.api.bodies import MediaBodyRoute, raw_body_openapi
from modelhost.api.deps import CallerPrincipal, ServicesDep, deployment_for, run_inference
from modelhost.api.errors import error_responses
from modelhost.container import Services
from modelhost.errors import InvalidRequest, param_name
from modelhost.media.sources import load_media
from modelhost.pipelines import PNG, TASKS, PipelineTask
from modelhost.protocol import tasks as p

router = APIRouter(
    tags=["tasks"],
    responses=error_responses(400, 401, 402, 404, 413, 429, 502, 503, 504),
    route_class=MediaBodyRoute,
)


def _examples(request: dict[str, Any], response: Any, raw_media: str | None = None) -> dict[str, Any]:
    """OpenAPI extras: an example request body and an example 200 answer for /docs, and for routes
    that take it (`raw_media`: the route's path), the raw file as an alternative body."""
    content: dict[str, Any] = {"application/json": {"example": request}}
    if raw_media is not None:
        content.update(raw_body_openapi(raw_media))
    return {
        "openapi_extra": {"requestBody": {"content": content}},
        "responses": {200: {"content": {"application/json": {"example": response}}}},
    }


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _answer(given: Any, results: list[Any]) -> Response:
    """One result for one input, the list of results for a list of inputs."""
    return Response(
        orjson.dumps(results if isinstance(given, list) else results[0]), media_type="application/json"
    )


def _limits(services: Services) -> dict[str, float]:
    settings = services.settings
    return {"max_pixels": settings.media_max_pixels, "max_seconds": settings.media_max_seconds}


async def _media(
    services: Services, values: list[str], field: str, timeout: float | None, allow_paths: bool = False
) -> list[bytes]:
    """Read every media reference of a request concurrently; the first bad one answers 400."""
    policy = services.media
    return list(
        await asyncio.gather(
            *(
                load_media(
                    v,
                    policy,
                    param=param_name(field, i, len(values)),
                    timeout=timeout,
                    allow_paths=allow_paths,
                )
                for i, v in enumerate(values)
            )
        )
    )


@dataclass(frozen=True)
class Media:
    """The media references of a request, read into `item[key]` once routing has accepted it."""

    key: str  # "images" or "videos"
    values: Any  # one reference or a list
    param: str
    timeout: float | None
    allow_paths: bool = False

    async def __call__(self, services: Services) -> dict[str, Any]:
        data = await _media(services, _as_list(self.values), self.param, self.timeout, self.allow_paths)
        return {self.key: data, "limits": _limits(services)}


async def _run(
    request: Request,
    services: Services,
    principal: CallerPrincipal,
    model: str | None,
    item: dict[str, Any],
    read: Callable[[Services], Awaitable[dict[str, Any]]] | None = None,
) -> list[Any]:
    """Route (400 "Endpoint not supported" before anything is fetched), read media, infer."""
    deployment = await deployment_for(request, principal, model)
    if read is not None:
        item = {**item, **await read(services)}
    output = await run_inference(request, deployment.runtime_key, item)
    results: list[Any] = output["results"]
    return results


@router.post(
    "/v1/classifications/video",
    summary="Video classification: top labels per video",
    response_model=list[p.LabelScore] | list[list[p.LabelScore]],
    **_examples(
        {"model": "videomae", "inputs": "https://example.com/clip.mp4", "top_k": 2},
        [{"label": "running", "score": 0.71}, {"label": "walking", "score": 0.2}],
    ),
)
async def video_classification(
    body: p.VideoClassificationRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    item = {
        "top_k": body.top_k,
        "num_frames": body.num_frames,
        "frame_sampling_rate": body.frame_sampling_rate,
        "function_to_apply": body.function_to_apply,
    }
    media = Media("videos", body.inputs, "inputs", body.timeout, allow_paths=True)
    return _answer(body.inputs, await _run(request, services, principal, body.model, item, media))


@router.post(
    "/v1/classifications/audio",
    summary="Audio classification: top labels per clip",
    response_model=list[p.LabelScore] | list[list[p.LabelScore]],
    **_examples(
        {"model": "keywords", "inputs": {"array": [0.0, 0.1, -0.1], "sampling_rate": 16000}, "top_k": 2},
        [{"label": "yes", "score": 0.8}, {"label": "no", "score": 0.1}],
        raw_media="/v1/classifications/audio",
    ),
)
async def audio_classification(
    body: p.AudioClassificationRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    several = isinstance(body.inputs, list) and not (body.inputs and isinstance(body.inputs[0], float | int))
    item = {"top_k": body.top_k, "function_to_apply": body.function_to_apply}
    audio = Audio(list(body.inputs) if several else [body.inputs], body.timeout)
    results = await _run(request, services, principal, body.model, item, audio)
    return Response(orjson.dumps(results if several else results[0]), media_type="application/json")


@dataclass(frozen=True)
class Audio:
    """Audio clips: files are fetched (concurrently), sample arrays travel as raw float32 with their
    rate (bare arrays are at the model's rate)."""

    clips: list[Any]
    timeout: float | None

    async def __call__(self, services: Services) -> dict[str, Any]:
        audios = await asyncio.gather(*(self._one(services, i, clip) for i, clip in enumerate(self.clips)))
        return {"audios": list(audios), "limits": _limits(services)}

    async def _one(self, services: Services, index: int, clip: Any) -> dict[str, Any]:
        if isinstance(clip, str):
            param = param_name("inputs", index, len(self.clips))
            policy = services.media
            return {"bytes": await load_media(clip, policy, param=param, timeout=self.timeout)}
        if isinstance(clip, p.AudioDescriptor):
            samples = clip.array if clip.array is not None else clip.raw
            return {"samples": _float32(samples), "sampling_rate": clip.sampling_rate}
        return {"samples": _float32(clip), "sampling_rate": None}


def _float32(samples: Any) -> bytes:
    return np.asarray(samples, dtype="<f4").tobytes()


@router.post(
    "/v1/question-answering/visual",
    summary="Visual question answering: answers with scores",
    response_model=list[p.LabelScore] | list[list[p.LabelScore]],
    **_examples(
        {"model": "vilt", "image": PNG, "question": "what is in the picture?", "top_k": 2},
        [{"label": "cat", "score": 0.82}, {"label": "dog", "score": 0.11}],
        raw_media="/v1/question-answering/visual",
    ),
)
async def visual_question_answering(
    body: p.VisualQuestionAnsweringRequest,
    request: Request,
    services: ServicesDep,
    principal: CallerPrincipal,
) -> Response:
    questions = _as_list(body.question)
    item = {
        "questions": questions,
        "pairs": _pairs(len(_as_list(body.image)), len(questions)),
        "top_k": body.top_k,
    }
    results = await _run(
        request, services, principal, body.model, item, Media("images", body.image, "image", body.timeout)
    )
    several = isinstance(body.image, list) or isinstance(body.question, list)
    return Response(orjson.dumps(results if several else results[0]), media_type="application/json")


@router.post(
    "/v1/question-answering/text",
    summary="Extractive question answering: the spans of the context that answer, best first",
    response_model=list[p.Answer] | list[list[p.Answer]],
    **_examples(
        {
            "model": "qa",
            "question": "Where does Sarah live?",
            "context": "My name is Sarah and I live in London.",
        },
        [{"answer": "London", "score": 0.97, "start": 31, "end": 37}],
    ),
)
async def question_answering(
    body: p.QuestionAnsweringRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    questions, contexts = _as_list(body.question), _as_list(body.context)
    count = max(len(questions), len(contexts))
    pairs = [[questions[i % len(questions)], contexts[i % len(contexts)]] for i in range(count)]
    item = {
        "pairs": pairs,
        "top_k": body.top_k,
        "max_answer_len": body.max_answer_len,
        "handle_impossible_answer": body.handle_impossible_answer,
    }
    results = await _run(request, services, principal, body.model, item)
    several = isinstance(body.question, list) or isinstance(body.context, list)
    return Response(orjson.dumps(results if several else results[0]), media_type="application/json")


def _pairs(images: int, questions: int) -> list[list[int]]:
    """One image with many questions, many images with one question, or equal lists pairwise."""
    if images == 1:
        return [[0, q] for q in range(questions)]
    if questions == 1:
        return [[i, 0] for i in range(images)]
    if images == questions:
        return [[i, i] for i in range(images)]
    raise InvalidRequest("Give one image, one question, or as many questions as images.", param="question")


MEDIA_KEYS = {"image/": "images", "video/": "videos"}  # the item key a fetched media field travels under


def add_task_route(task: PipelineTask) -> None:
    """Register the task endpoint of a pipeline whose request fields are its handler's options, one for
    one (`modelhost.pipelines` declares its path, types, media field and /docs text): the media field is
    fetched into `images` or `videos`, text `inputs` become a list, and every other field that is set
    goes to the handler under its own name. One input gets one result, a list of inputs a list (or, for
    a `one_list` task, always the list)."""
    assert task.request is not None and task.example is not None
    media = task.raw_media

    async def endpoint(body: Any, request: Request, services: Any, principal: Any) -> Response:
        item = body.model_dump(exclude={"model", "timeout"}, exclude_none=True)
        given = getattr(body, media.field if media else "inputs")
        read = None
        if media is not None:
            del item[media.field]
            read = Media(MEDIA_KEYS[media.content_types[0]], given, media.field, body.timeout)
        else:
            item["inputs"] = _as_list(item["inputs"])  # as plain data (pairs as dicts)
        results = await _run(request, services, principal, body.model, item, read)
        if task.one_list:
            return Response(orjson.dumps(results), media_type="application/json")
        return _answer(given, results)

    # FastAPI reads the body type from the signature: the task's own request model
    endpoint.__annotations__ = {
        "body": task.request,
        "request": Request,
        "services": ServicesDep,
        "principal": CallerPrincipal,
        "return": Response,
    }
    router.add_api_route(
        task.endpoint,
        endpoint,
        methods=["POST"],
        name=task.name.replace("-", "_"),
        summary=task.summary,
        response_model=task.response,
        **_examples(*task.example, raw_media=task.endpoint if media else None),
    )


# Every task endpoint with a request type and no route of its own above gets the generic one.
_own_routes = {route.path for route in router.routes if isinstance(route, APIRoute)}
for _task in TASKS:
    if _task.request is not None and _task.endpoint not in _own_routes:
        add_task_route(_task)
