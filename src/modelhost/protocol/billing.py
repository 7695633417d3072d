"""Usage reports: `GET /v1/usage` (docs/billing.md). Credits are exact to the micro-credit."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class DeploymentUsage(BaseModel):
    deployment_id: str
    model: str | None = Field(description="The deployment's model ID when it was billed.")
    compute_credits: float


class ArtifactUsage(BaseModel):
    artifact_id: str
    display_name: str | None = Field(description="Null once the artifact is deleted.")
    compute_credits: float = Field(description="Replicas of deployments of this artifact.")
    storage_credits: float


class DayUsage(BaseModel):
    date: str = Field(description="UTC day, `YYYY-MM-DD`.", examples=["2026-11-22"])
    compute_credits: float
    storage_credits: float
    credits: float


class Usage(BaseModel):
    object: Literal["usage"] = "usage"
    account_id: str
    start: datetime = Field(description="Start of the range (inclusive).")
    end: datetime = Field(description="End of the range (exclusive).")
    credits_balance: float = Field(description="Now: credits granted minus credits used, all time.")
    credits_granted: float = Field(description="All time.")
    credits_used: float = Field(description="All time.")
    credits: float = Field(description="Billed within the range: compute plus storage.")
    compute_credits: float = Field(description="Replica memory × loaded time, within the range.")
    storage_credits: float = Field(description="Artifact size × stored time, within the range.")
    by_deployment: list[DeploymentUsage]
    by_artifact: list[ArtifactUsage]
    by_day: list[DayUsage]
