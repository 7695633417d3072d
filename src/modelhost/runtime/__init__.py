"""Replicas: where models run, and how requests reach them.

One package per process that runs its code: `gateway` (every gateway process), `supervisor` (the
supervisor alone) and `worker` (the replica processes). The modules at this level are what more than one
of them runs: a deployment's spec, its engine choice and footprint, capacity and measured memory, the
replica interface, the replica protocol, the metrics (docs/architecture.md, "The three processes").
"""
