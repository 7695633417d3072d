"""The runtime as every gateway process uses it, the supervisor's included: the `Runtime` that routes
and runners call (`interface`), adapter deployments sent to their base's replicas (`adapters`),
admission and the choice of replica (`dispatch`), and the connection to one replica (`client`).

Imports nothing of the supervisor's part or the worker's: a gateway reaches replicas only over the
replica protocol (`runtime.replica_protocol`), and the supervisor only over the control socket.
"""
