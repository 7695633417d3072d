"""Hugging Face-style task endpoints (api.md §4.1, §4.4–§4.12)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from modelhost.protocol.common import StrictModel

Text = Annotated[str, Field(min_length=1)]


class TaskRequest(StrictModel):
    """Fields every task endpoint accepts besides its own."""

    model: str | None = Field(
        default=None, description="Deployment model ID; optional with a key scoped to one deployment."
    )


class FeatureExtractionRequest(TaskRequest):
    inputs: Text | Annotated[list[Text], Field(min_length=1, max_length=2048)] = Field(
        description="A string or a list of strings.", examples=["Paris is the capital of France."]
    )


# ---------------------------------------------------------------- media-taking task requests

MediaRef = Annotated[
    str,
    Field(min_length=1, description="base64, a `data:` URI, or an http(s) URL"),
]
MAX_MEDIA_INPUTS = 64
MAX_QA_PAIRS = 64
Timeout = Annotated[
    float | None,
    Field(
        default=None,
        ge=0,
        description="Seconds allowed for fetching remote media; null means the server's maximum.",
    ),
]
TopK = Annotated[int | None, Field(default=None, ge=1, le=1000, description="How many top labels.")]
FunctionToApply = Literal["sigmoid", "softmax", "none"]


class TokenClassificationRequest(TaskRequest):
    inputs: Text | Annotated[list[Text], Field(min_length=1, max_length=2048)] = Field(
        description="A string or a list of strings.", examples=["my name is sarah and i live in london"]
    )
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] | None = Field(
        default=None, description="Group sub-word tokens into entities (transformers' strategies)."
    )


class FillMaskRequest(TaskRequest):
    inputs: Text | Annotated[list[Text], Field(min_length=1, max_length=2048)] = Field(
        description="Text containing the model's mask token (e.g. `[MASK]`), or a list of such texts.",
        examples=["paris is the [MASK] of france"],
    )
    targets: Text | Annotated[list[Text], Field(min_length=1, max_length=100)] | None = Field(
        default=None, description="Only score these words in place of the mask."
    )
    top_k: TopK = None


class TextPair(StrictModel):
    """Two texts classified together (natural language inference, paraphrase, …), as the pipeline takes."""

    text: Text
    text_pair: Text


class TextClassificationRequest(TaskRequest):
    inputs: Text | TextPair | Annotated[list[Text | TextPair], Field(min_length=1, max_length=2048)] = Field(
        description="A text, a `{text, text_pair}` pair, or a list of either.",
        examples=["what a wonderful film"],
    )
    top_k: int | None = Field(
        default=1, ge=1, le=1000, description="How many labels per input, best first (null: all of them)."
    )
    function_to_apply: FunctionToApply | None = Field(
        default=None,
        description="`softmax`, `sigmoid` or `none`; default: sigmoid for one label or multi-label models.",
    )


class QuestionAnsweringRequest(TaskRequest):
    question: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_QA_PAIRS)] = Field(
        examples=["Where does Sarah live?"]
    )
    context: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_QA_PAIRS)] = Field(
        examples=["My name is Sarah and I live in London."]
    )
    top_k: int = Field(default=1, ge=1, le=100, description="How many answers per question, best first.")
    max_answer_len: int = Field(default=15, ge=1, le=512, description="The longest answer, in tokens.")
    handle_impossible_answer: bool = Field(
        default=False, description='Let "no answer" (`""` at 0–0) compete with the spans.'
    )

    @model_validator(mode="after")
    def _pairs(self) -> QuestionAnsweringRequest:
        questions, contexts = self.question, self.context
        if isinstance(questions, list) and isinstance(contexts, list) and len(questions) != len(contexts):
            raise ValueError("give one question, one context, or as many questions as contexts")
        return self


class ZeroShotTextRequest(TaskRequest):
    inputs: Text | Annotated[list[Text], Field(min_length=1, max_length=2048)] = Field(
        description="A text or a list of texts.", examples=["the new phone's battery lasts two days"]
    )
    candidate_labels: Annotated[list[Text], Field(min_length=1, max_length=100)] = Field(
        examples=[["technology", "sports", "politics"]]
    )
    hypothesis_template: Text | None = Field(
        default=None, description="Where `{}` stands for each label; default `This example is {}.`"
    )
    multi_label: bool = Field(
        default=False,
        description="Score each label on its own (entailment vs contradiction) instead of the labels "
        "against each other.",
    )

    @field_validator("hypothesis_template")
    @classmethod
    def _has_a_placeholder(cls, value: str | None) -> str | None:
        if value is not None and "{}" not in value:
            raise ValueError("must contain {} where each candidate label goes")
        return value


class ZeroShotText(BaseModel):
    sequence: str
    labels: list[str] = Field(description="The candidate labels, best first.")
    scores: list[float]


class ZeroShotImageRequest(TaskRequest):
    image: MediaRef | Annotated[list[MediaRef], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    candidate_labels: Annotated[list[Text], Field(min_length=1, max_length=100)] = Field(
        examples=[["cat", "dog", "car"]]
    )
    hypothesis_template: str | None = Field(
        default=None, description="Sentence with `{}` where each label goes; default `This is a photo of {}.`"
    )
    timeout: Timeout = None

    @field_validator("hypothesis_template")
    @classmethod
    def _has_placeholder(cls, value: str | None) -> str | None:
        if value is not None and "{}" not in value:
            raise ValueError("hypothesis_template must contain the placeholder {}")
        return value


class VideoClassificationRequest(TaskRequest):
    inputs: MediaRef | Annotated[list[MediaRef], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)] = Field(
        description="Video URL or a local path below the operator's media root, or a list of them."
    )
    top_k: TopK = None
    num_frames: int | None = Field(default=None, ge=1, le=1024, description="Frames sampled per video.")
    frame_sampling_rate: int | None = Field(default=None, ge=1, le=1000, description="Take every n-th frame.")
    function_to_apply: FunctionToApply | None = None
    timeout: Timeout = None


class AudioDescriptor(StrictModel):
    """`{"array" | "raw": [numbers], "sampling_rate": n}` as the Hugging Face pipelines accept."""

    array: list[float] | None = None
    raw: list[float] | None = None
    sampling_rate: int = Field(ge=1, le=384_000)

    @model_validator(mode="after")
    def _one_of(self) -> AudioDescriptor:
        if (self.array is None) == (self.raw is None):
            raise ValueError("give exactly one of 'array' and 'raw'")
        if not (self.array if self.array is not None else self.raw):
            raise ValueError("the audio has no samples")
        return self


class AudioClassificationRequest(TaskRequest):
    inputs: (
        Annotated[list[float], Field(min_length=1)]
        | MediaRef
        | AudioDescriptor
        | Annotated[list[MediaRef | AudioDescriptor], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    ) = Field(
        description=(
            "One clip as an array of samples (at the model's rate), base64 / data URI / URL of a "
            "WAV, FLAC, MP3 or OGG file, or a descriptor with `sampling_rate`; or a list of files "
            "and descriptors."
        )
    )
    top_k: TopK = None
    function_to_apply: FunctionToApply | None = None
    timeout: Timeout = None


class ImageSegmentationRequest(TaskRequest):
    inputs: MediaRef | Annotated[list[MediaRef], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    subtask: Literal["panoptic", "instance", "semantic"] | None = None
    threshold: float | None = Field(default=None, ge=0, le=1)
    mask_threshold: float | None = Field(default=None, ge=0, le=1)
    overlap_mask_area_threshold: float | None = Field(default=None, ge=0, le=1)
    timeout: Timeout = None


class VisualQuestionAnsweringRequest(TaskRequest):
    image: MediaRef | Annotated[list[MediaRef], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    question: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    top_k: TopK = None
    timeout: Timeout = None


class GenerateKwargs(StrictModel):
    """The `generate` options a caller may set; anything else is refused."""

    max_new_tokens: int | None = Field(default=None, ge=1, le=1024)
    min_new_tokens: int | None = Field(default=None, ge=0, le=1024)
    num_beams: int | None = Field(default=None, ge=1, le=16)
    do_sample: bool | None = None
    # below 0.01 the scaled logits overflow to inf and sampling fails: a 400, not the model's error
    temperature: float | None = Field(default=None, ge=0.01, le=10)
    top_k: int | None = Field(default=None, ge=0, le=1000)
    top_p: float | None = Field(default=None, gt=0, le=1)
    repetition_penalty: float | None = Field(default=None, ge=0.01, le=10)
    no_repeat_ngram_size: int | None = Field(default=None, ge=0, le=32)
    length_penalty: float | None = Field(default=None, ge=-10, le=10)
    seed: int | None = Field(default=None, ge=0, le=2**64 - 1, description="torch's seed: 64 bits at most.")


class ImageToTextRequest(TaskRequest):
    inputs: MediaRef | Annotated[list[MediaRef], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    max_new_tokens: int | None = Field(default=None, ge=1, le=1024)
    generate_kwargs: GenerateKwargs | None = None
    timeout: Timeout = None


class Text2TextRequest(TaskRequest):
    """Summarization, translation and text2text generation: an encoder-decoder model's `generate`."""

    inputs: Text | Annotated[list[Text], Field(min_length=1, max_length=256)] = Field(
        description="A text or a list of texts.", examples=["paris is the capital of france"]
    )
    max_new_tokens: int | None = Field(
        default=None, ge=1, le=1024, description="The most tokens to generate; default: the model's own."
    )
    generate_kwargs: GenerateKwargs | None = None


class TranslationRequest(Text2TextRequest):
    src_lang: Text | None = Field(
        default=None,
        description="The source language: a code of the model's tokenizer (`eng_Latn`) for multilingual "
        "models, required there; for others a language name used in the prompt (`English`).",
    )
    tgt_lang: Text | None = Field(default=None, description="The target language, as `src_lang`.")


class ImageClassificationRequest(TaskRequest):
    inputs: MediaRef | Annotated[list[MediaRef], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    top_k: TopK = None
    function_to_apply: FunctionToApply | None = None
    timeout: Timeout = None


class ObjectDetectionRequest(TaskRequest):
    inputs: MediaRef | Annotated[list[MediaRef], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    threshold: float = Field(default=0.5, ge=0, le=1, description="Boxes scoring below are left out.")
    timeout: Timeout = None


class DepthEstimationRequest(TaskRequest):
    inputs: MediaRef | Annotated[list[MediaRef], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    return_predicted_depth: bool = Field(
        default=True,
        description="Also give the model's depth values (rows of numbers, the image's size); false leaves "
        "them out of large answers.",
    )
    timeout: Timeout = None


class ImageFeatureExtractionRequest(TaskRequest):
    inputs: MediaRef | Annotated[list[MediaRef], Field(min_length=1, max_length=MAX_MEDIA_INPUTS)]
    timeout: Timeout = None


# ---------------------------------------------------------------- responses


class Entity(BaseModel):
    word: str
    score: float
    entity: str
    index: int | None = None
    start: int | None
    end: int | None
    entity_group: str | None = Field(default=None, description="With `aggregation_strategy` only.")


class MaskFill(BaseModel):
    sequence: str
    score: float
    token: int
    token_str: str


class LabelScore(BaseModel):
    label: str
    score: float


class Segmentation(BaseModel):
    masks: list[str] = Field(description="One base64 PNG per segment (0 / 255 grey levels).")
    scores: list[float | None] = Field(description="Confidence per segment; null for semantic segments.")
    labels: list[str | None] = Field(description="Class label per segment.")


class GeneratedText(BaseModel):
    generated_text: str


class Box(BaseModel):
    xmin: int
    ymin: int
    xmax: int
    ymax: int


class Detection(BaseModel):
    label: str
    score: float
    box: Box = Field(description="In pixels of the image as sent.")


class Depth(BaseModel):
    depth: str = Field(
        description="The depth map as a base64 grey PNG of the image's size (nearer is lighter)."
    )
    predicted_depth: list[list[float]] | None = Field(
        default=None, description="The model's values, one row per pixel row; absent when not asked for."
    )


class SummaryText(BaseModel):
    summary_text: str


class TranslationText(BaseModel):
    translation_text: str


class Answer(BaseModel):
    answer: str
    score: float
    start: int = Field(description="Character offsets of the answer in its context.")
    end: int
