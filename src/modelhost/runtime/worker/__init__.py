"""The replica worker processes, one model each, and the worker template that forks them.

`sync_worker` is the worker of the engines it steps itself between messages (a `select` loop over a
`ReplicaHost`, `host`: torch, the encoder runtimes, the native generation engine); `async_worker` the
asyncio loop of the engines that step themselves, run by `vllm_worker` (under vLLM's Python) and
`llamacpp_worker`. `template` forks workers from a process that imported torch once; `spawn` is how
the supervisor starts one; `vllm_registry` says, under vLLM's Python, what that environment can run.

Imports nothing of the gateway's part or the supervisor's: a worker knows its callers only by the
replica protocol (`runtime.replica_protocol`).
"""
