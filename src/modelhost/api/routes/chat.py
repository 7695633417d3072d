"""`POST /v1/chat/completions` and `POST /v1/completions` (OpenAI-compatible, api.md §4.16, §6): parse,
call the serving of chat (`serving.chat`), respond with its JSON or its Server-Sent Events."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from modelhost.api.deps import CallerPrincipal, ServicesDep, await_or_disconnect, deployment_for
from modelhost.api.errors import error_responses
from modelhost.auth.principal import Principal
from modelhost.container import Services
from modelhost.frontend import Target, Until
from modelhost.protocol.chat import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfoResponse,
)
from modelhost.serving import chat

router = APIRouter(tags=["openai"], responses=error_responses(400, 401, 402, 404, 413, 429, 502, 503))
SSE = {"text/event-stream": {"example": 'data: {"object": "chat.completion.chunk", ...}\n\ndata: [DONE]\n\n'}}

CHAT_EXAMPLE = {
    "id": "chatcmpl-4f1c",
    "object": "chat.completion",
    "created": 1767225600,
    "model": "chat",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! How can I help?", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
}


@router.post(
    "/v1/chat/completions",
    summary="Chat completion (OpenAI-compatible; `stream: true` answers Server-Sent Events)",
    response_model=ChatCompletion,
    responses={200: {"content": {"application/json": {"example": CHAT_EXAMPLE}, **SSE}}},
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model, user=body.user)
    answer = await chat.chat_completion(
        body, services.generation, Target.of(deployment, principal), _until(request)
    )
    return _respond(answer)


@router.post(
    "/v1/completions",
    summary="Text completion (OpenAI-compatible legacy completions; `stream: true` answers SSE)",
    response_model=Completion,
    responses={200: {"content": SSE}},
)
async def completions(
    body: CompletionRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    deployment = await deployment_for(request, principal, body.model, user=body.user)
    answer = await chat.completion(
        body, services.generation, Target.of(deployment, principal), _until(request)
    )
    return _respond(answer)


@router.post(
    "/tokenize",
    summary="A prompt's token IDs, or those of a chat as the deployment's template renders it (as vLLM)",
    response_model=TokenizeResponse,
)
async def tokenize(
    body: TokenizeRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    return await _tokens(body, request, services, principal)


@router.post("/detokenize", summary="The text of token IDs (as vLLM)", response_model=DetokenizeResponse)
async def detokenize(
    body: DetokenizeRequest, request: Request, services: ServicesDep, principal: CallerPrincipal
) -> Response:
    return await _tokens(body, request, services, principal)


@router.get(
    "/tokenizer_info",
    summary="The deployment's tokenizer configuration and chat template (as vLLM)",
    response_model=TokenizerInfoResponse,
)
async def tokenizer_info(
    request: Request,
    services: ServicesDep,
    principal: CallerPrincipal,
    model: str | None = Query(default=None, max_length=128, description="Your deployment's model ID."),
) -> Response:
    """What lm-eval's `local-completions` reads to use the server's tokenizer: with a deployment key
    (no `model`, as lm-eval asks) or `?model=`."""
    deployment = await deployment_for(request, principal, model)
    answer = await chat.tokenizer_info(services.generation, Target.of(deployment), _until(request))
    return Response(orjson.dumps(answer), media_type="application/json")


async def _tokens(
    body: TokenizeRequest | DetokenizeRequest, request: Request, services: Services, principal: Principal
) -> Response:
    """Both routes: the replica answers either body (`generation.requests.tokenized`)."""
    deployment = await deployment_for(request, principal, body.model)
    answer = await chat.tokenize(body, services.generation, Target.of(deployment), _until(request))
    return Response(orjson.dumps(answer), media_type="application/json")


def _until(request: Request) -> Until:
    """A whole answer is waited for until the client goes away (499)."""
    return lambda work: await_or_disconnect(request, work)


def _respond(answer: chat.Answer) -> Response:
    if isinstance(answer, dict):
        return Response(orjson.dumps(answer), media_type="application/json")
    return StreamingResponse(answer, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
