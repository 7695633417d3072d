"""Pipeline task → the handler a worker loads for it, as `modelhost.pipelines` declares.

Handlers are named, not imported: they pull in torch and the model libraries, which only worker
processes should load.
"""

from __future__ import annotations

import importlib

from modelhost.pipelines import BY_NAME
from modelhost.tasks.base import AnyTaskHandler


def served(pipeline: str) -> bool:
    return pipeline in BY_NAME


def handler_for(pipeline: str) -> AnyTaskHandler:
    module_name, _, class_name = BY_NAME[pipeline].handler.partition(":")
    handler: AnyTaskHandler = getattr(importlib.import_module(module_name), class_name)()
    return handler
