"""The trainer process: `python -m modelhost.fine_tuning.trainer`, started by the fine-tuning runner for
one job (or one resumption of it), reading a `Train` on stdin and writing its events on stdout
(`fine_tuning.messages`).

It trains a LoRA adapter with PEFT on the base's safetensors weights (never remote code):
- every conversation is rendered by the base's chat template (the deployment's own where it sets one,
  else the model's), in the budgeted sandbox replicas render templates in, within the deployment's
  context;
- the loss is on the tokens of the assistant messages of weight 1 only: their text and the template's
  end of turn, found by rendering the conversation up to each such message;
- AdamW at 1e-3 × `learning_rate_multiplier`, examples shuffled per epoch by the job's seed;
- every `checkpoint_every` steps, and at the end, the adapter is saved (`save_pretrained`:
  adapter_config.json and adapter_model.safetensors) as `step-<n>/`; a resumed run loads the last one
  and continues at the step after it with the same order of examples (the optimizer's moments start
  again: docs/fine-tuning.md).
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any

from modelhost.fine_tuning.dataset import DatasetError, check_dataset
from modelhost.fine_tuning.messages import (
    Checkpointed,
    Failed,
    Finished,
    Started,
    Step,
    Train,
    frame,
    read_train,
)

BASE_LEARNING_RATE = 1e-3
LORA_RANK, LORA_ALPHA = 8, 16
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VALIDATION_EXAMPLES = 32  # the validation loss of each step is measured on at most this many


class Example:
    __slots__ = ("ids", "labels")

    def __init__(self, ids: list[int], labels: list[int]) -> None:
        self.ids, self.labels = ids, labels


def _emit(message: Any) -> None:
    sys.stdout.buffer.write(frame(message))
    sys.stdout.buffer.flush()


def encode(tokenizer: Any, conversation: dict[str, Any], line: int, context: int) -> Example:
    """The conversation's tokens, and labels on the learnt assistant messages' tokens (-100 elsewhere)."""
    tools = conversation.get("tools")
    messages = [{k: v for k, v in m.items() if k != "weight"} for m in conversation["messages"]]

    def render(upto: list[dict[str, Any]], prompt: bool = False) -> str:
        text = tokenizer.apply_chat_template(upto, tools=tools, tokenize=False, add_generation_prompt=prompt)
        return str(text)

    full = render(messages)
    spans: list[tuple[int, int]] = []
    for index, message in enumerate(conversation["messages"]):
        if message["role"] != "assistant" or message.get("weight", 1) != 1:
            continue
        start, end = len(render(messages[:index], prompt=True)), len(render(messages[: index + 1]))
        if not full.startswith(render(messages[: index + 1])):
            raise DatasetError(
                line, "the base's chat template does not render the conversation turn by turn."
            )
        spans.append((start, end))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    if len(ids) > context:
        raise DatasetError(
            line,
            f"the conversation is {len(ids)} tokens in the base's chat template, more than its "
            f"context of {context} tokens.",
        )
    labels = [
        token if any(s <= begin < e for s, e in spans) else -100
        for token, (begin, _) in zip(ids, encoded["offset_mapping"], strict=True)
    ]
    return Example(ids, labels)


def _load(path: str, param: str, tokenizer: Any, context: int) -> list[Example]:
    try:
        checked = check_dataset(Path(path).read_bytes())
        return [encode(tokenizer, c, n, context) for n, c in enumerate(checked.conversations, start=1)]
    except DatasetError as exc:
        raise _Refused("invalid_" + param, f"{param}: {exc}", param) from None


class _Refused(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def _batch(examples: list[Example], pad: int, torch: Any, device: str) -> dict[str, Any]:
    width = max(len(e.ids) for e in examples)
    ids = [e.ids + [pad] * (width - len(e.ids)) for e in examples]
    labels = [e.labels + [-100] * (width - len(e.labels)) for e in examples]
    mask = [[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in examples]
    return {
        "input_ids": torch.tensor(ids, device=device),
        "labels": torch.tensor(labels, device=device),
        "attention_mask": torch.tensor(mask, device=device),
    }


def order(examples: int, batch_size: int, epochs: int, seed: int) -> list[list[int]]:
    """Every step's examples, in order: each epoch a shuffle of them by (seed, epoch), cut in batches."""
    steps: list[list[int]] = []
    for epoch in range(epochs):
        indices = list(range(examples))
        random.Random(f"{seed}:{epoch}").shuffle(indices)
        steps.extend(indices[i : i + batch_size] for i in range(0, examples, batch_size))
    return steps


def train(job: Train) -> None:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modelhost.generation import chat_templates

    chat_templates.install()
    if job.threads:
        torch.set_num_threads(job.threads)
    torch.manual_seed(job.seed)
    tokenizer = AutoTokenizer.from_pretrained(job.base_dir, trust_remote_code=False)
    if job.chat_template:  # the deployment's own, as its replicas render requests
        tokenizer.chat_template = job.chat_template
    model = AutoModelForCausalLM.from_pretrained(
        job.base_dir, trust_remote_code=False, use_safetensors=True, torch_dtype=torch.float32
    )
    context = job.max_model_len or int(
        getattr(model.config, "max_position_embeddings", 0) or tokenizer.model_max_length
    )
    training = _load(job.training_path, "training_file", tokenizer, context)
    validation = (
        _load(job.validation_path, "validation_file", tokenizer, context)[:VALIDATION_EXAMPLES]
        if job.validation_path
        else []
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
    if job.resume_from:
        model = PeftModel.from_pretrained(model, job.resume_from, is_trainable=True)
    else:
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        targets = [t for t in TARGETS if t in present]
        config = LoraConfig(
            r=LORA_RANK,
            lora_alpha=LORA_ALPHA,
            target_modules=targets,
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, config)
    model.to(job.device)
    hyper = job.hyperparameters
    steps = order(len(training), hyper.batch_size, hyper.n_epochs, job.seed)
    per_epoch = sum(sum(1 for t in e.labels if t != -100) for e in training)
    _emit(Started(len(steps), len(training), per_epoch))
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=BASE_LEARNING_RATE * hyper.learning_rate_multiplier,
        weight_decay=0.0,
    )
    trained = sum(sum(1 for t in training[i].labels if t != -100) for s in steps[: job.start_step] for i in s)
    step, loss_value, valid = job.start_step, math.nan, None
    for step in range(job.start_step + 1, len(steps) + 1):
        chosen = [training[i] for i in steps[step - 1]]
        model.train()
        loss = model(**_batch(chosen, pad, torch, job.device)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss_value = float(loss.item())
        trained += sum(sum(1 for t in e.labels if t != -100) for e in chosen)
        valid = _validation_loss(model, validation, pad, torch, job.device)
        _emit(Step(step, loss_value, valid, trained))
        if step % job.checkpoint_every == 0 or step == len(steps):
            folder = Path(job.out_dir) / f"step-{step}"
            model.save_pretrained(str(folder), safe_serialization=True)
            _emit(Checkpointed(step, str(folder), loss_value, valid))
    _emit(Finished(str(Path(job.out_dir) / f"step-{len(steps)}"), trained))


def _validation_loss(model: Any, examples: list[Example], pad: int, torch: Any, device: str) -> float | None:
    if not examples:
        return None
    model.eval()
    with torch.no_grad():
        return float(model(**_batch(examples, pad, torch, device)).loss.item())


def main() -> None:
    job = read_train(sys.stdin.buffer)
    try:
        train(job)
    except _Refused as refused:
        _emit(Failed(refused.code, refused.message, refused.param))
    except MemoryError:
        _emit(Failed("out_of_memory", "The trainer ran out of memory."))
    except Exception as exc:  # reported to the job: the process ends either way
        _emit(Failed("training_error", f"{type(exc).__name__}: {exc}"[:2000]))


if __name__ == "__main__":
    main()
