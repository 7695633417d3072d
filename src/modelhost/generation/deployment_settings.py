"""A text-generation deployment's own generation settings (docs/generation.md, "Per-deployment settings"):
its context length (`max_model_len`), a chat template that replaces the artifact's, default template
arguments, the tool and reasoning parsers that replace the ones detected, and what a prompt and an output
token cost in its tenants' fair shares (`fair_token_weights`: `generation.fairness.TokenWeights`).

The gateway checks them (`check`) and stores the fields set; a replica loads with them: the supervisor
hands them over in the replica's environment (`ENVIRONMENT`, as it hands over the KV cache's size), read
by both engines when they load (`from_environment`). A change reloads the deployment's replicas.

A chat template is the customer's Jinja: it is only ever rendered by transformers' `apply_chat_template`
in a replica, which compiles every template in our budgeted sandbox (`generation.chat_templates`: jinja2's
`ImmutableSandboxedEnvironment`, no file or network access, no attribute escapes, with CPU-time and size
bounds). Here it is only compiled, never rendered, in the same sandbox, so a syntax error (or an unknown
filter) is a 400 at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from modelhost.errors import InvalidRequest
from modelhost.generation.fairness import TokenWeights
from modelhost.generation.families import REASONING_PARSER_NAMES, TOOL_PARSER_NAMES, Family

ENVIRONMENT = "MODELHOST_GENERATION_SETTINGS"  # the settings as JSON, in a generation replica's environment
# Characters of a chat template: the longest published ones (gpt-oss's) are about 16,000; the settings
# travel in an environment variable, which Linux caps at 128 KiB
MAX_CHAT_TEMPLATE = 32_768
NO_REASONING = "none"  # `reasoning_parser: "none"`: reasoning is not split from the answer
FIELDS = (
    "max_model_len",
    "chat_template",
    "chat_template_kwargs",
    "tool_parser",
    "reasoning_parser",
    "fair_token_weights",
)


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """The settings set on a deployment; None (or empty): the artifact's own, or what is detected."""

    max_model_len: int | None = None
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    fair_token_weights: Mapping[str, float] = field(default_factory=dict)  # `prompt`, `output`

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> GenerationSettings:
        """From the stored fields (the deployment's `generation_settings` column)."""
        known = {k: v for k, v in (stored or {}).items() if k in FIELDS and v is not None}
        return cls(**known)

    def stored(self) -> dict[str, Any] | None:
        """The fields set, as stored; None when none is."""
        fields = {name: getattr(self, name) for name in FIELDS}
        fields["chat_template_kwargs"] = dict(self.chat_template_kwargs) or None
        fields["fair_token_weights"] = dict(self.fair_token_weights) or None
        set_ = {k: v for k, v in fields.items() if v is not None}
        return set_ or None

    @classmethod
    def from_environment(cls) -> GenerationSettings:
        """In a replica: the settings the supervisor gave it (none where it gave none)."""
        text = os.environ.get(ENVIRONMENT)
        return cls.of(json.loads(text)) if text else cls()

    def environment(self) -> dict[str, str]:
        """What a replica's environment carries of them (nothing where none is set)."""
        stored = self.stored()
        return {ENVIRONMENT: json.dumps(stored, ensure_ascii=False)} if stored else {}

    def family(self, detected: Family) -> Family:
        """The detected family with the deployment's parsers in its place: what the replica says on each
        request's `started` event, so the gateway parses with them."""
        family = detected
        if self.tool_parser is not None:
            family = replace(family, tool_parser=self.tool_parser)
        if self.reasoning_parser is not None:
            parser = None if self.reasoning_parser == NO_REASONING else self.reasoning_parser
            family = replace(family, reasoning_parser=parser)
        return family

    def use_template(self, holder: Any) -> None:
        """The deployment's chat template in place of the artifact's, on a tokenizer or a processor."""
        if self.chat_template is not None and holder is not None:
            holder.chat_template = self.chat_template

    def token_weights(self) -> TokenWeights:
        """What a prompt and an output token cost in the engine's counters: the deployment's, else 1 and
        2 (`generation.fairness.TokenWeights`)."""
        return TokenWeights(**{k: float(v) for k, v in self.fair_token_weights.items() if v is not None})

    def context(self, model_context: int) -> int:
        """The context a replica runs with: the deployment's `max_model_len`, at most the model's."""
        return min(model_context, self.max_model_len) if self.max_model_len else model_context


def check(settings: GenerationSettings, model_context: int | None) -> None:
    """400 naming the field for a setting that cannot be used: a `max_model_len` over the model's own
    context (`model_context`; None: unknown, unchecked), an unknown parser. A chat template is a tenant's
    code: its caller compiles it in a compile process first (`compile_sandbox.GrammarChecker
    .check_chat_template`, which runs `check_chat_template`), never here."""
    length = settings.max_model_len
    if length is not None and model_context is not None and length > model_context:
        raise InvalidRequest(
            f"max_model_len {length} is over the model's own context of {model_context} tokens.",
            param="max_model_len",
        )
    if settings.tool_parser is not None and settings.tool_parser not in TOOL_PARSER_NAMES:
        raise InvalidRequest(
            f"tool_parser {settings.tool_parser!r} is not one of {', '.join(sorted(TOOL_PARSER_NAMES))}.",
            param="tool_parser",
        )
    reasoning = {*REASONING_PARSER_NAMES, NO_REASONING}
    if settings.reasoning_parser is not None and settings.reasoning_parser not in reasoning:
        raise InvalidRequest(
            f"reasoning_parser {settings.reasoning_parser!r} is not one of {', '.join(sorted(reasoning))}.",
            param="reasoning_parser",
        )


def check_chat_template(template: str) -> None:
    """Compile (never render) the template in the sandbox transformers renders it in, with the tags
    transformers adds (`{% generation %}`, `break` / `continue`): a syntax error or an unknown filter is
    a 400."""
    import jinja2
    import jinja2.ext

    from modelhost.generation.chat_templates import BudgetedSandbox

    class Generation(jinja2.ext.Extension):
        """transformers' `{% generation %}...{% endgeneration %}` (assistant-token tracking): parsed only."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    environment = BudgetedSandbox(extensions=[Generation, jinja2.ext.loopcontrols])
    try:
        environment.from_string(template)  # compiled, never rendered
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidRequest(
            f"chat_template is not valid Jinja (line {exc.lineno}): {exc.message}", param="chat_template"
        ) from None
    except (jinja2.TemplateError, RecursionError) as exc:  # nested deeper than Python's parser goes
        message = str(exc) if isinstance(exc, jinja2.TemplateError) else "nested too deeply"
        raise InvalidRequest(f"chat_template is not valid Jinja: {message}", param="chat_template") from None
