"""Model artifacts and upload sessions (api.md §2.3, §2.4, §4.13, §4.14; management.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from modelhost.protocol.common import StrictModel

# The pipeline tasks a deployment can serve: the wire vocabulary of `pipeline`.
Pipeline = Literal[
    "token-classification",
    "fill-mask",
    "feature-extraction",
    "zero-shot-image-classification",
    "video-classification",
    "audio-classification",
    "image-segmentation",
    "visual-question-answering",
    "image-to-text",
    "image-feature-extraction",
    "text-generation",
    "text-to-image",
    "image-to-image",
    "inpainting",
    "text-to-speech",
    "automatic-speech-recognition",
    "text-to-video",
    "text-classification",
    "text-ranking",
    "zero-shot-classification",
    "image-classification",
    "object-detection",
    "depth-estimation",
    "question-answering",
    "summarization",
    "translation",
    "text2text-generation",
    "image-text-to-text",
]
ArtifactStatus = Literal["created", "ingesting", "ready", "failed"]
UploadStatus = Literal["open", "completing", "completed", "failed", "aborted", "expired"]


class ArtifactCreate(StrictModel):
    display_name: Annotated[str, Field(min_length=1, max_length=200)]
    pipeline: Pipeline


class ArtifactError(BaseModel):
    code: str
    message: str


class Adapter(BaseModel):
    """What inspection found in a LoRA adapter (PEFT's `adapter_config.json` and its weights)."""

    peft_type: Literal["LORA"]
    rank: int
    alpha: float
    target_modules: list[str] | str = Field(
        description="The modules it adapts, by name (or PEFT's regular expression, or `all-linear`)."
    )
    base_model_name_or_path: str | None = Field(description="The base it was trained on, as PEFT wrote it.")
    bytes: int = Field(description="Size of its weights.")


class Quantization(BaseModel):
    """How a quantized model's weights are stored (docs/artifacts.md, "Quantized models")."""

    method: str = Field(
        description="`gptq`, `awq`, `compressed-tensors`, `fp8`, `bitsandbytes` (from config.json's "
        "`quantization_config`), or `gguf`."
    )
    bits: int | None = Field(description="Bits per weight (a GGUF file type's nominal bits: Q4_K_M → 4).")
    group_size: int | None = Field(
        description="Weights sharing one scale (a GGUF type's block size); null: one per output channel."
    )
    scheme: str | None = Field(
        description="compressed-tensors' scheme (`W4A16`, `W8A16`, `W8A8`, `FP8`...), a GGUF's file type "
        "(`Q4_0`, `Q8_0`, `Q4_K_M`, `F16`...), bitsandbytes' `nf4` / `fp4` / `int8`."
    )


class Gguf(BaseModel):
    """A GGUF model's files and what its header says (read by modelhost's own bounded parser)."""

    model_file: str = Field(description="The file llama.cpp loads: the first part of a split set.")
    parts: int = Field(description="Files of the model: 1, or N for a `-0000k-of-0000N.gguf` split set.")
    mmproj_file: str | None = Field(description="A vision projector (`mmproj*.gguf`), recorded, not served.")
    architecture: str = Field(description="`general.architecture`: llama, qwen3, qwen2, gemma3, bert...")
    file_type: str | None = Field(description="`general.file_type`: F16, Q8_0, Q4_0, Q4_K_M...")
    tensor_count: int
    tensor_bytes: int = Field(description="Bytes of tensor data, all parts together.")
    tensor_types: dict[str, int] = Field(description='Tensors per ggml type (`{"Q4_0": 15, "F32": 9}`).')
    context_length: int | None
    block_count: int | None = Field(description="Layers.")
    embedding_length: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    tokenizer_model: str | None = Field(
        description="The embedded tokenizer: `gpt2` (byte-level BPE), `llama`..."
    )
    has_chat_template: bool
    embedding: bool = Field(description="An embedding model (served as feature-extraction).")


class ModelArtifact(BaseModel):
    id: str
    display_name: str
    pipeline: Pipeline
    status: ArtifactStatus
    kind: Literal["model", "adapter"] = Field(
        default="model",
        description="What inspection found: a full model, or a LoRA adapter deployed on a base "
        "(docs/adapters.md). `model` until an upload is inspected.",
    )
    adapter: Adapter | None = Field(default=None, description="The adapter, where `kind` is `adapter`.")
    quantization: Quantization | None = Field(
        default=None, description="How the weights are quantized; null: full precision (or not inspected)."
    )
    serving: dict[str, dict[str, str | None]] | None = Field(
        default=None,
        description="For a quantized model: per engine (`vllm`, `llamacpp`, `transformers`) and device "
        "kind of this server (`cpu`, `cuda`), null where it can be served, else why not "
        '(`{"vllm": {"cpu": "FP8 on CPU needs AMX (amx_tile); this CPU has none."}}`).',
    )
    gguf: Gguf | None = Field(default=None, description="A GGUF model's files and header facts.")
    size_gb: float = Field(description="Size of the served files in GB (10^9 bytes).")
    created_at: datetime
    updated_at: datetime
    error: ArtifactError | None = Field(default=None, description="Why the last inspection failed.")
    upload_id: str | None = Field(default=None, description="The open upload session, while ingesting.")
    import_id: str | None = Field(
        default=None,
        description="The import filling that session, while an import fills it (docs/artifacts.md).",
    )
    bytes_done: int | None = Field(default=None, description="Bytes the import has fetched so far.")
    bytes_total: int | None = Field(default=None, description="Bytes the import will fetch, once listed.")


SourceText = Annotated[str, Field(min_length=1, max_length=8192)]
ImportStatus = Literal["queued", "running", "completed", "failed", "cancelled"]


class HttpsFile(StrictModel):
    """One file of a list of https URLs: where it lands (default: the URL's last path segment) and its
    stated sha256, verified."""

    url: SourceText
    path: Annotated[str, Field(max_length=512)] | None = None
    sha256: Annotated[str, Field(max_length=64)] | None = None


class ImportCreate(StrictModel):
    """`POST /v1/model-artifacts/{artifact_id}/imports`."""

    source: SourceText | Annotated[list[SourceText | HttpsFile], Field(min_length=1, max_length=1000)] = (
        Field(
            description="`s3://bucket/prefix`, `hf://org/name[@revision]`, an `https://` file URL (or one "
            "`.tar`, `.tar.gz`, `.zip` archive), or a list of https files: URLs or `{url, path?, sha256?}`."
        )
    )
    include: list[Annotated[str, Field(max_length=512)]] | None = Field(
        default=None,
        max_length=256,
        description="fnmatch patterns on the artifact path; only matches are imported.",
    )
    exclude: list[Annotated[str, Field(max_length=512)]] | None = Field(
        default=None,
        max_length=256,
        description="fnmatch patterns on the artifact path; matches are left out.",
    )
    credentials: dict[str, str | dict[str, str]] | None = Field(
        default=None,
        description="Per-import credentials, stored encrypted while the import runs and never returned: "
        "s3 `{aws_access_key_id, aws_secret_access_key, aws_session_token?, endpoint_url?, region?}`, "
        "hf `{token}`, https `{bearer_token}` or `{headers: {name: value}}`.",
    )

    def given_source(self) -> str | list[str | dict[str, str]]:
        """The source as plain values, as the import's source reads it."""
        if isinstance(self.source, str):
            return self.source
        return [s if isinstance(s, str) else s.model_dump(exclude_none=True) for s in self.source]


class ImportedFile(BaseModel):
    path: str
    size: int | None
    status: Literal["pending", "fetching", "done"]


class ArtifactImport(BaseModel):
    id: str
    object: Literal["model_artifact.import"] = "model_artifact.import"
    artifact_id: str
    upload_id: str = Field(description="The server-side upload session the import fills.")
    status: ImportStatus
    source: str = Field(description="The source as shown: no credential, no URL query.")
    include: list[str] | None
    exclude: list[str] | None
    bytes_done: int
    bytes_total: int | None = Field(description="The listed files' bytes; null until listed.")
    files: list[ImportedFile]
    error: ArtifactError | None = Field(
        default=None, description="Why it failed (docs/artifacts.md, Imports)."
    )
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class UploadStarted(BaseModel):
    upload_id: str
    message: str
    artifact: ModelArtifact


class UploadFinished(BaseModel):
    message: str
    artifact: ModelArtifact


class UploadedFile(BaseModel):
    path: str
    size: int
    sha256: str


class UploadSession(BaseModel):
    upload_id: str
    artifact_id: str
    status: UploadStatus
    files: list[UploadedFile]
    created_at: datetime
    expires_at: datetime
