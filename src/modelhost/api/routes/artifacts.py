"""Model artifacts, their upload sessions and imports (account key). What stores bytes or starts an
import is admitted with the key (`api.admission`): 402 once the account is out of credits, 429 past its
spend caps or its key's or account's rate limits."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Header, Path, Request

from modelhost.api.deps import AccountPrincipal, ServicesDep, account_id_of
from modelhost.api.errors import error_responses
from modelhost.artifacts.service import ArtifactView
from modelhost.protocol.artifacts import (
    Adapter,
    ArtifactCreate,
    ArtifactError,
    ArtifactImport,
    Gguf,
    ImportCreate,
    ImportedFile,
    ModelArtifact,
    Quantization,
    UploadedFile,
    UploadFinished,
    UploadSession,
    UploadStarted,
)
from modelhost.protocol.common import Deleted, ListOf
from modelhost.store import models

router = APIRouter(
    prefix="/v1/model-artifacts", tags=["model artifacts"], responses=error_responses(400, 401)
)

ArtifactId = Path(max_length=64, description="Model artifact ID (`art_...`).")
UploadId = Path(max_length=64, description="Upload session ID (`upl_...`).")
ImportId = Path(max_length=64, description="Import ID (`imp_...`).")
GB = 1_000_000_000


def present(view: ArtifactView) -> ModelArtifact:
    artifact = view.artifact
    error = (
        ArtifactError(code=artifact.error_code, message=artifact.error_message or "")
        if artifact.error_code
        else None
    )
    return ModelArtifact(
        id=artifact.id,
        display_name=artifact.display_name,
        pipeline=artifact.pipeline,
        status=artifact.status,
        kind=artifact.kind,
        adapter=Adapter.model_validate(artifact.adapter) if artifact.adapter else None,
        quantization=Quantization.model_validate(artifact.quantization) if artifact.quantization else None,
        serving=artifact.serving,
        gguf=Gguf.model_validate(artifact.gguf) if artifact.gguf else None,
        size_gb=round(artifact.size_bytes / GB, 9),
        created_at=artifact.created_at,
        updated_at=artifact.updated_at,
        error=error,
        upload_id=view.upload_id,
        import_id=view.importing.id if view.importing else None,
        bytes_done=view.importing.bytes_done if view.importing else None,
        bytes_total=view.importing.bytes_total if view.importing else None,
    )


def present_import(row: models.ArtifactImport) -> ArtifactImport:
    return ArtifactImport(
        id=row.id,
        artifact_id=row.artifact_id,
        upload_id=row.upload_id,
        status=row.status,
        source=row.source,
        include=row.include,
        exclude=row.exclude,
        bytes_done=row.bytes_done,
        bytes_total=row.bytes_total,
        files=[ImportedFile.model_validate(f) for f in row.files],
        error=ArtifactError(code=row.error_code, message=row.error_message or "") if row.error_code else None,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
    )


@router.post("", summary="Create a model artifact (status `created`)", status_code=201)
def create_artifact(
    body: ArtifactCreate, principal: AccountPrincipal, services: ServicesDep
) -> ModelArtifact:
    return present(services.artifacts.create(account_id_of(principal), body.display_name, body.pipeline))


@router.get("", summary="List model artifacts")
def list_artifacts(principal: AccountPrincipal, services: ServicesDep) -> ListOf[ModelArtifact]:
    return ListOf[ModelArtifact](
        data=[present(v) for v in services.artifacts.list_artifacts(account_id_of(principal))]
    )


@router.get("/{artifact_id}", summary="Get a model artifact", responses=error_responses(404))
def get_artifact(
    principal: AccountPrincipal, services: ServicesDep, artifact_id: str = ArtifactId
) -> ModelArtifact:
    return present(services.artifacts.get(account_id_of(principal), artifact_id))


@router.delete(
    "/{artifact_id}",
    summary="Delete a model artifact (409 `artifact_busy` while a deployment uses it)",
    responses=error_responses(404, 409),
)
def delete_artifact(
    principal: AccountPrincipal, services: ServicesDep, artifact_id: str = ArtifactId
) -> Deleted:
    services.artifacts.delete(account_id_of(principal), artifact_id)
    return Deleted(id=artifact_id, object="model_artifact.deleted")


@router.post(
    "/{artifact_id}/uploads",
    summary="Start an upload session (409 `artifact_busy` if ingesting or in use by a deployment)",
    status_code=201,
    responses=error_responses(404, 409),
)
def start_upload(
    principal: AccountPrincipal, services: ServicesDep, artifact_id: str = ArtifactId
) -> UploadStarted:
    upload, view = services.artifacts.start_upload(account_id_of(principal), artifact_id)
    return UploadStarted(
        upload_id=upload.id,
        message=f"Upload session opened: PUT each file to .../uploads/{upload.id}/files/<path>, "
        "then POST .../complete.",
        artifact=present(view),
    )


@router.put(
    "/{artifact_id}/uploads/{upload_id}/files/{path:path}",
    summary="Upload one file (raw bytes, streamed; `X-Content-SHA256` verified when given)",
    responses=error_responses(404, 409, 413, 507),
    openapi_extra={
        "requestBody": {
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
        }
    },
)
async def upload_file(
    request: Request,
    principal: AccountPrincipal,
    services: ServicesDep,
    artifact_id: str = ArtifactId,
    upload_id: str = UploadId,
    path: str = Path(description="Path of the file inside the artifact, e.g. `tokenizer/vocab.json`."),
    x_content_sha256: str | None = Header(default=None, description="Hex SHA-256 of the body, verified."),
) -> UploadedFile:
    length = request.headers.get("content-length")
    record = await services.artifacts.put_file(
        account_id_of(principal),
        artifact_id,
        upload_id,
        path,
        request.stream(),
        x_content_sha256,
        declared_size=int(length) if length and length.isdigit() else None,
    )
    return UploadedFile(path=record.path, size=record.size, sha256=record.sha256)


@router.get(
    "/{artifact_id}/uploads/{upload_id}", summary="Show an upload session", responses=error_responses(404)
)
def get_upload(
    principal: AccountPrincipal,
    services: ServicesDep,
    artifact_id: str = ArtifactId,
    upload_id: str = UploadId,
) -> UploadSession:
    upload, files = services.artifacts.get_session(account_id_of(principal), artifact_id, upload_id)
    return UploadSession(
        upload_id=upload.id,
        artifact_id=upload.artifact_id,
        status=upload.status,
        files=[UploadedFile(path=f.path, size=f.size, sha256=f.sha256) for f in files],
        created_at=upload.created_at,
        expires_at=upload.expires_at,
    )


@router.post(
    "/{artifact_id}/uploads/{upload_id}/complete",
    summary="Complete an upload: inspect the files and mark the artifact ready or failed",
    responses=error_responses(404, 409, 507),
)
def complete_upload(
    principal: AccountPrincipal,
    services: ServicesDep,
    artifact_id: str = ArtifactId,
    upload_id: str = UploadId,
) -> UploadFinished:
    view, message = services.artifacts.complete(account_id_of(principal), artifact_id, upload_id)
    return UploadFinished(message=message, artifact=present(view))


@router.delete(
    "/{artifact_id}/uploads/{upload_id}",
    summary="Abort an upload session; the artifact returns to its previous state",
    responses=error_responses(404, 409),
)
def abort_upload(
    principal: AccountPrincipal,
    services: ServicesDep,
    artifact_id: str = ArtifactId,
    upload_id: str = UploadId,
) -> UploadFinished:
    view = services.artifacts.abort(account_id_of(principal), artifact_id, upload_id)
    return UploadFinished(message="Upload session aborted.", artifact=present(view))


@router.post(
    "/{artifact_id}/imports",
    summary="Import the artifact's files from S3, HTTPS or a Hugging Face Hub (409 `artifact_busy` as for "
    "an upload); the server fetches, verifies and inspects them in the background",
    status_code=202,
    responses=error_responses(402, 404, 409, 429),
)
async def start_import(
    body: ImportCreate,
    principal: AccountPrincipal,
    services: ServicesDep,
    artifact_id: str = ArtifactId,
) -> ArtifactImport:
    row = await asyncio.to_thread(
        services.imports.create,
        account_id_of(principal),
        artifact_id,
        body.given_source(),
        body.include,
        body.exclude,
        body.credentials,
    )
    services.wake("imports")
    return present_import(row)


@router.get(
    "/{artifact_id}/imports/{import_id}",
    summary="Show an import: its status, progress and files",
    responses=error_responses(404),
)
def get_import(
    principal: AccountPrincipal,
    services: ServicesDep,
    artifact_id: str = ArtifactId,
    import_id: str = ImportId,
) -> ArtifactImport:
    return present_import(services.imports.get(account_id_of(principal), artifact_id, import_id))


@router.delete(
    "/{artifact_id}/imports/{import_id}",
    summary="Cancel an import; the artifact returns to its previous state and the fetched files go",
    responses=error_responses(404, 409),
)
def cancel_import(
    principal: AccountPrincipal,
    services: ServicesDep,
    artifact_id: str = ArtifactId,
    import_id: str = ImportId,
) -> ArtifactImport:
    return present_import(services.imports.cancel(account_id_of(principal), artifact_id, import_id))
