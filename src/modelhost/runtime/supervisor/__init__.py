"""The runtime's part that only the supervisor runs (and the embedded server): the `ReplicaManager`
(`manager`: readiness, loads, restarts, the idle reaper), its backends (`local` worker processes,
`ray_backend` Ray Serve applications), the command a worker starts with (`launch`), the memory budget at
work (`placement`) and the meters of adapters held by their base's replicas (`adapter_meters`).

The supervisor is also a gateway, so it may use the gateway's part; and it starts workers, so it may use
the worker's (`spawn`, and the hosting loop a Ray actor runs).
"""
