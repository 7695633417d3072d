"""The schedulers vLLM's engine core runs for modelhost (`SchedulerConfig.scheduler_cls`, set by
`engines.vllm.load`): vLLM's own with fair shares between tenants mixed in (`engines.vllm_shares`).
Imported only in vLLM's environment (`.venv-vllm`), by vLLM.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from modelhost.engines.vllm_shares import FairShares


class FairScheduler(FairShares, Scheduler):  # type: ignore[misc]
    """vLLM's synchronous scheduler (its choice on a CPU) with fair shares."""


class FairAsyncScheduler(FairShares, AsyncScheduler):  # type: ignore[misc]
    """vLLM's asynchronous scheduler (its choice on a GPU) with fair shares."""
