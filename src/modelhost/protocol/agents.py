"""Agents, runs and run events (api.md §2.1, §3.3, §4.15, §6.3; docs/agents.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from modelhost.protocol.chat import Message, Tool
from modelhost.protocol.common import StrictModel


class AgentCreateRequest(StrictModel):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    model: str = Field(description="A text-generation deployment of your account.", examples=["chat"])
    instructions: Annotated[str, Field(max_length=100_000)] = Field(
        description="Sent as the system message of every run."
    )
    tools: Annotated[list[Tool], Field(min_length=1, max_length=128)] | None = None


class Agent(BaseModel):
    id: str
    object: Literal["agent"] = "agent"
    created_at: int
    name: str
    model: str
    instructions: str
    tools: list[dict[str, Any]]


class AgentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Agent]
    first_id: str | None
    last_id: str | None
    has_more: bool


class AgentDeleted(BaseModel):
    id: str
    object: Literal["agent.deleted"] = "agent.deleted"
    deleted: bool = True


class RunCreateRequest(StrictModel):
    input: str | Annotated[list[Message], Field(min_length=1)] = Field(
        description="A user message, or messages (after the agent's instructions)."
    )
    tool_choice: Literal["auto", "required"] | None = Field(
        default=None,
        description="With tools: `auto` (default, the model decides) or `required` (a call is forced by "
        "constrained decoding).",
    )
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    seed: int | None = None


class RunError(BaseModel):
    code: str
    message: str


class Run(BaseModel):
    id: str
    object: Literal["agent.run"] = "agent.run"
    agent_id: str
    model: str
    status: Literal["queued", "in_progress", "completed", "failed", "cancelled", "requires_action"]
    created_at: int
    completed_at: int | None
    output: str | None = Field(description="The assistant's text, once the run has finished.")
    tool_calls: list[dict[str, Any]] = Field(description="Tool calls the model made (`requires_action`).")
    error: RunError | None


class RunList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Run]
    first_id: str | None
    last_id: str | None
    has_more: bool


class RunEvent(BaseModel):
    object: Literal["agent.run.event"] = "agent.run.event"
    run_id: str
    seq: int = Field(description="1, 2, ... in the order the events happened.")
    type: Literal[
        "run.created",
        "run.in_progress",
        "message.delta",
        "message.completed",
        "tool_call",
        "run.completed",
        "run.requires_action",
        "run.failed",
        "run.cancelled",
    ]
    created_at: float = Field(description="Unix time in seconds, with fractions.")
    data: dict[str, Any]


class RunEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[RunEvent]


class RunDeleted(BaseModel):
    """api.md §2.1."""

    id: str
    object: Literal["agent.run.deleted"] = "agent.run.deleted"
    deleted: bool = True
