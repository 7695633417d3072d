"""Every pipeline task modelhost serves, declared once.

One entry says all there is to know about a task outside its handler: the endpoints it answers, the
request and response types of its task endpoint, the field a raw file body stands for, the handler the
worker loads, and the library tables whose architectures artifact inspection accepts for it. Routing
(`modelhost.routing`), the raw-body routes (`api.bodies`), the worker's handler registry
(`tasks.registry`) and inspection (`artifacts.architectures`) are all derived from `TASKS`, so adding a
pipeline is one handler file plus one entry here (docs/architecture.md walks through an example).

This module sits in the base layer: it imports only the wire protocol and the engine table (`engine_table`:
the engines a task lists are those whose row names it), and names handlers as strings
because they pull in torch and the model libraries, which only worker processes load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from modelhost.engine_table import EngineName, engines_for
from modelhost.protocol import tasks as p
from modelhost.protocol.artifacts import Pipeline


@dataclass(frozen=True, slots=True)
class RawMedia:
    """The task endpoint also takes the file itself as the request body (the other parameters then go
    in the query string): `field` is the JSON field the body stands for, `content_types` the accepted
    Content-Type prefixes."""

    field: str
    content_types: tuple[str, ...]


IMAGE_BODY = RawMedia("inputs", ("image/",))
# a 1×1 PNG, for the examples /docs shows
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


@dataclass(frozen=True, slots=True)
class PipelineTask:
    """One pipeline task (see the module docstring)."""

    name: Pipeline
    # "module:Class" of the worker-side handler (`tasks.base.TaskHandler`); its file is named after the task
    handler: str
    # the endpoints a deployment of this task answers; the first is its task endpoint
    endpoints: tuple[str, ...]
    # transformers' auto-mapping tables (`modeling_auto.*_MAPPING_NAMES`) whose architectures serve it
    transformers_mappings: tuple[str, ...] = ()
    # or diffusers' AutoPipeline table (`auto_pipeline.*_MAPPING`) whose pipeline families serve it
    diffusers_mapping: str | None = None
    # what inspection requires beside the weights: tokenizer files, a processor's config
    needs_tokenizer: bool = False
    needs_processor: bool = False
    # only the architectures of those tables that read text alone (not speech or vision models that
    # share a table with text ones: the seq-to-seq table holds Whisper-like and audio-LLM classes)
    text_only: bool = False
    # the task endpoint's request and response types, where it is a Hugging Face-style task endpoint
    request: type[p.TaskRequest] | None = None
    response: Any = None
    # the answer is always a list with one result per input, as transformers' text2text pipelines
    # answer (`[{summary_text}]` for one text); otherwise one input gets its result, a list a list
    one_list: bool = False
    raw_media: RawMedia | None = None
    # for /docs: the task endpoint's summary and an example request and answer
    summary: str = ""
    example: tuple[dict[str, Any], Any] | None = None

    @property
    def endpoint(self) -> str:
        return self.endpoints[0]

    @property
    def engines(self) -> tuple[EngineName, ...]:
        """The engines that can run it inside a replica, in `auto`'s order, the fallback last: those
        whose row in `engine_table` lists it."""
        return engines_for(self.name)


def _scores(item: Any) -> Any:
    """One result per input, or a list of them for a list of inputs."""
    return list[item] | list[list[item]]


def _text2text(
    name: Pipeline,
    handler: str,
    endpoint: str,
    request: type[p.TaskRequest],
    answer: type[Any],
    summary: str,
    example: tuple[dict[str, Any], Any],
) -> PipelineTask:
    """Summarization, translation and text2text generation: one encoder-decoder handler module
    (`tasks.text2text_generation`), text-only seq-to-seq architectures, a flat list of answers."""
    return PipelineTask(
        name,
        f"modelhost.tasks.text2text_generation:{handler}",
        (endpoint,),
        ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",),
        text_only=True,
        needs_tokenizer=True,
        request=request,
        response=list[answer],  # type: ignore[valid-type]
        one_list=True,
        summary=summary,
        example=example,
    )


TASKS: tuple[PipelineTask, ...] = (
    PipelineTask(
        "token-classification",
        "modelhost.tasks.token_classification:TokenClassification",
        ("/v1/classifications/token",),
        ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",),
        request=p.TokenClassificationRequest,
        response=_scores(p.Entity),
        summary="Token classification (named entities): a list of entities per input",
        example=(
            {"model": "ner", "inputs": "my name is sarah", "aggregation_strategy": "simple"},
            [
                {
                    "entity": "PER",
                    "entity_group": "PER",
                    "score": 0.98,
                    "word": "sarah",
                    "start": 11,
                    "end": 16,
                }
            ],
        ),
        needs_tokenizer=True,
    ),
    PipelineTask(
        "fill-mask",
        "modelhost.tasks.fill_mask:FillMask",
        ("/v1/fill-mask",),
        ("MODEL_FOR_MASKED_LM_MAPPING_NAMES",),
        request=p.FillMaskRequest,
        response=_scores(p.MaskFill),
        summary="Fill the mask token: candidate words with scores",
        example=(
            {"model": "bert", "inputs": "paris is the [MASK] of france", "top_k": 1},
            [
                {
                    "sequence": "paris is the capital of france",
                    "score": 0.91,
                    "token": 3007,
                    "token_str": "capital",
                }
            ],
        ),
        needs_tokenizer=True,
    ),
    PipelineTask(
        "feature-extraction",
        "modelhost.tasks.feature_extraction:FeatureExtraction",
        ("/v1/feature-extraction", "/v1/embeddings"),
        # Any encoder gives features; sentence-transformers pools whatever its Transformer module holds.
        ("MODEL_MAPPING_NAMES", "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES"),
        needs_tokenizer=True,
    ),
    PipelineTask(
        "zero-shot-image-classification",
        "modelhost.tasks.zero_shot_image_classification:ZeroShotImageClassification",
        ("/v1/classifications/zero-shot/image",),
        ("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
        request=p.ZeroShotImageRequest,
        response=_scores(p.LabelScore),
        raw_media=RawMedia("image", ("image/",)),
        summary="Zero-shot image classification against candidate labels",
        example=(
            {"model": "clip", "image": PNG, "candidate_labels": ["cat", "dog"]},
            [{"label": "cat", "score": 0.93}, {"label": "dog", "score": 0.07}],
        ),
        needs_tokenizer=True,
        needs_processor=True,
    ),
    PipelineTask(
        "video-classification",
        "modelhost.tasks.video_classification:VideoClassification",
        ("/v1/classifications/video",),
        ("MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES",),
        request=p.VideoClassificationRequest,
        response=_scores(p.LabelScore),
        raw_media=RawMedia("inputs", ("video/",)),
        needs_processor=True,
    ),
    PipelineTask(
        "audio-classification",
        "modelhost.tasks.audio_classification:AudioClassification",
        ("/v1/classifications/audio",),
        ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",),
        request=p.AudioClassificationRequest,
        response=_scores(p.LabelScore),
        raw_media=RawMedia("inputs", ("audio/",)),
        needs_processor=True,
    ),
    PipelineTask(
        "image-segmentation",
        "modelhost.tasks.image_segmentation:ImageSegmentation",
        ("/v1/images/segmentation",),
        (
            "MODEL_FOR_IMAGE_SEGMENTATION_MAPPING_NAMES",
            "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
            "MODEL_FOR_INSTANCE_SEGMENTATION_MAPPING_NAMES",
            "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES",
        ),
        request=p.ImageSegmentationRequest,
        response=p.Segmentation | list[p.Segmentation],
        raw_media=IMAGE_BODY,
        summary="Image segmentation: base64 PNG masks with scores (a list of these for a list of images)",
        example=(
            {"model": "segformer", "inputs": PNG, "subtask": "semantic"},
            {"masks": ["iVBORw0KGgo..."], "scores": [None], "labels": ["cat"]},
        ),
        needs_processor=True,
    ),
    PipelineTask(
        "visual-question-answering",
        "modelhost.tasks.visual_question_answering:VisualQuestionAnswering",
        ("/v1/question-answering/visual",),
        ("MODEL_FOR_VISUAL_QUESTION_ANSWERING_MAPPING_NAMES", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
        request=p.VisualQuestionAnsweringRequest,
        response=_scores(p.LabelScore),
        raw_media=RawMedia("image", ("image/",)),
        needs_tokenizer=True,
        needs_processor=True,
    ),
    PipelineTask(
        "image-to-text",
        "modelhost.tasks.image_to_text:ImageToText",
        ("/v1/images/to-text",),
        ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",),
        request=p.ImageToTextRequest,
        response=_scores(p.GeneratedText),
        raw_media=IMAGE_BODY,
        summary="Image captioning",
        example=(
            {"model": "blip", "inputs": PNG, "max_new_tokens": 20},
            [{"generated_text": "a cat on a sofa"}],
        ),
        needs_tokenizer=True,
        needs_processor=True,
    ),
    PipelineTask(
        "image-feature-extraction",
        "modelhost.tasks.image_feature_extraction:ImageFeatureExtraction",
        ("/v1/images/feature-extraction",),
        (
            "MODEL_FOR_IMAGE_MAPPING_NAMES",
            "MODEL_MAPPING_NAMES",
            "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
        ),
        request=p.ImageFeatureExtractionRequest,
        response=list[float] | list[list[float]],
        raw_media=IMAGE_BODY,
        summary="Image feature extraction: one vector per image",
        example=({"model": "vit", "inputs": PNG}, [0.0123, -0.0456, 0.0789]),
        needs_processor=True,
    ),
    PipelineTask(
        "text-generation",
        "modelhost.tasks.text_generation:TextGeneration",
        (
            "/v1/chat/completions",
            "/v1/responses",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/completions",
            "/v1/realtime",  # a realtime session's answers (WebSocket: api.routes.realtime)
            "/tokenize",
            "/detokenize",
            "/tokenizer_info",
        ),
        ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",),
        needs_tokenizer=True,
    ),
    PipelineTask(
        "image-text-to-text",
        "modelhost.tasks.image_text_to_text:ImageTextToText",
        # chat with image_url parts (chat completions), input_image parts (Responses) and image blocks
        # (Messages), and text alone
        (
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/realtime",
            "/tokenize",
            "/detokenize",
            "/tokenizer_info",
        ),
        ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",),
        needs_tokenizer=True,
        needs_processor=True,
    ),
    PipelineTask(
        "text-to-image",
        "modelhost.tasks.text_to_image:TextToImage",
        ("/v1/images/generations",),
        diffusers_mapping="AUTO_TEXT2IMAGE_PIPELINES_MAPPING",
    ),
    PipelineTask(
        "image-to-image",
        "modelhost.tasks.image_to_image:ImageToImage",
        ("/v1/images/edits",),
        diffusers_mapping="AUTO_IMAGE2IMAGE_PIPELINES_MAPPING",
    ),
    PipelineTask(
        "inpainting",
        "modelhost.tasks.inpainting:Inpainting",
        ("/v1/images/edits",),
        diffusers_mapping="AUTO_INPAINT_PIPELINES_MAPPING",
    ),
    PipelineTask(
        "text-to-speech",
        "modelhost.tasks.text_to_speech:TextToSpeech",
        ("/v1/audio/speech",),
        ("MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES", "MODEL_FOR_TEXT_TO_SPECTROGRAM_MAPPING_NAMES"),
        needs_tokenizer=True,
    ),
    PipelineTask(
        "automatic-speech-recognition",
        "modelhost.tasks.speech_recognition:SpeechRecognition",
        ("/v1/audio/transcriptions", "/v1/audio/translations"),
        ("MODEL_FOR_CTC_MAPPING_NAMES", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
        needs_tokenizer=True,
        needs_processor=True,
    ),
    PipelineTask(
        "text-to-video",
        "modelhost.tasks.text_to_video:TextToVideo",
        ("/v1/videos",),
        diffusers_mapping="AUTO_TEXT2VIDEO_PIPELINES_MAPPING",
    ),
    PipelineTask(
        "text-classification",
        "modelhost.tasks.text_classification:TextClassification",
        ("/v1/classifications/text",),
        ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",),
        request=p.TextClassificationRequest,
        response=_scores(p.LabelScore),
        summary="Text classification: the best labels per text or text pair",
        example=(
            {"model": "sentiment", "inputs": "what a wonderful film"},
            [{"label": "positive", "score": 0.98}],
        ),
        needs_tokenizer=True,
    ),
    PipelineTask(
        "zero-shot-classification",
        "modelhost.tasks.zero_shot_text_classification:ZeroShotTextClassification",
        ("/v1/classifications/zero-shot/text",),
        ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",),
        needs_tokenizer=True,
        request=p.ZeroShotTextRequest,
        response=p.ZeroShotText | list[p.ZeroShotText],
        summary="Zero-shot text classification against candidate labels (an NLI model)",
        example=(
            {
                "model": "nli",
                "inputs": "the battery lasts two days",
                "candidate_labels": ["technology", "sports"],
            },
            {
                "sequence": "the battery lasts two days",
                "labels": ["technology", "sports"],
                "scores": [0.93, 0.07],
            },
        ),
    ),
    PipelineTask(
        "image-classification",
        "modelhost.tasks.image_classification:ImageClassification",
        ("/v1/classifications/image",),
        ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
        needs_processor=True,
        request=p.ImageClassificationRequest,
        response=_scores(p.LabelScore),
        raw_media=IMAGE_BODY,
        summary="Image classification: the best labels per image",
        example=(
            {"model": "vit", "inputs": PNG, "top_k": 2},
            [{"label": "cat", "score": 0.91}, {"label": "dog", "score": 0.05}],
        ),
    ),
    PipelineTask(
        "object-detection",
        "modelhost.tasks.object_detection:ObjectDetection",
        ("/v1/images/object-detection",),
        ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",),
        needs_processor=True,
        request=p.ObjectDetectionRequest,
        response=list[p.Detection] | list[list[p.Detection]],
        raw_media=IMAGE_BODY,
        summary="Object detection: labelled boxes with scores per image",
        example=(
            {"model": "detr", "inputs": PNG, "threshold": 0.9},
            [{"label": "cat", "score": 0.97, "box": {"xmin": 12, "ymin": 8, "xmax": 220, "ymax": 190}}],
        ),
    ),
    PipelineTask(
        "depth-estimation",
        "modelhost.tasks.depth_estimation:DepthEstimation",
        ("/v1/images/depth-estimation",),
        ("MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES",),
        needs_processor=True,
        request=p.DepthEstimationRequest,
        response=p.Depth | list[p.Depth],
        raw_media=IMAGE_BODY,
        summary="Depth estimation: a depth map per image (a grey PNG, and the model's values)",
        example=(
            {"model": "dpt", "inputs": PNG, "return_predicted_depth": False},
            {"depth": "iVBORw0KGgo...", "predicted_depth": None},
        ),
    ),
    PipelineTask(
        "question-answering",
        "modelhost.tasks.question_answering:QuestionAnswering",
        ("/v1/question-answering/text",),
        ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",),
        needs_tokenizer=True,
        # its own route (api.routes.tasks): questions and contexts pair up
    ),
    _text2text(
        "summarization",
        "Summarization",
        "/v1/text/summarization",
        p.Text2TextRequest,
        p.SummaryText,
        "Summarization: one summary per text",
        (
            {"model": "bart-cnn", "inputs": "The tower is 324 metres tall ...", "max_new_tokens": 60},
            [{"summary_text": "The tower is 324 metres tall."}],
        ),
    ),
    _text2text(
        "translation",
        "Translation",
        "/v1/text/translation",
        p.TranslationRequest,
        p.TranslationText,
        "Translation: one translation per text",
        (
            {"model": "nllb", "inputs": "hello world", "src_lang": "eng_Latn", "tgt_lang": "fra_Latn"},
            [{"translation_text": "bonjour le monde"}],
        ),
    ),
    _text2text(
        "text2text-generation",
        "Text2TextGeneration",
        "/v1/text/generation",
        p.Text2TextRequest,
        p.GeneratedText,
        "Text2text generation (T5-style prompts): one generated text per input",
        (
            {"model": "flan-t5", "inputs": "question: what is the capital of france?"},
            [{"generated_text": "paris"}],
        ),
    ),
    PipelineTask(
        "text-ranking",
        "modelhost.tasks.text_ranking:TextRanking",
        # Cohere's clients post to /v1/rerank (ClientV1) and /v2/rerank (ClientV2); Jina's and others
        # to /v1/rerank or /rerank: one route answers all three (api.routes.rerank)
        ("/v1/rerank", "/v2/rerank", "/rerank"),
        ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",),
        needs_tokenizer=True,
    ),
)

BY_NAME: dict[str, PipelineTask] = {task.name: task for task in TASKS}


def _endpoint_tasks() -> dict[str, tuple[Pipeline, ...]]:
    found: dict[str, tuple[Pipeline, ...]] = {}
    for task in TASKS:
        for endpoint in task.endpoints:
            found[endpoint] = (*found.get(endpoint, ()), task.name)
    return found


# endpoint → the pipeline tasks whose deployments answer it
ENDPOINT_TASKS: dict[str, tuple[Pipeline, ...]] = _endpoint_tasks()
# task endpoint → its raw-body field and content types
RAW_MEDIA: dict[str, RawMedia] = {t.endpoint: t.raw_media for t in TASKS if t.raw_media is not None}

assert set(BY_NAME) == set(get_args(Pipeline)), "every Pipeline has exactly one entry in TASKS"
