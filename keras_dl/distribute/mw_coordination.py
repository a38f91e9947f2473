"""How long TF's coordination service waits for a silent multi-worker worker: the stall timeout.

``MultiWorkerMirroredStrategy`` starts TF's coordination service (the chief is its leader) and
every worker sends it heartbeats; a worker silent for the service's heartbeat timeout is
declared unhealthy and every collective aborts ("The following tasks are unhealthy (stopped
sending heartbeats)"). TF's default timeout is 10 s, so a host's link down for 20 s mid-epoch
(a switch restarting) ended the job on the two-host test cluster, where Horovod rode it out.
:func:`configure` sets it to ``runtime.stall_timeout``, the wait keras_dl allows a peer
anywhere else: a blip shorter than that is ridden out, and a host gone for good is declared
unhealthy after it (:mod:`keras_dl.launch.spark_workers` then reports it lost: exit 75).

It configures the service as MWMS itself would (``collective_all_reduce_strategy.py``,
``_initialize_multi_worker``: standalone, the cluster's coordination leader, the worker job),
before the strategy exists, since MWMS leaves a service already configured alone.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def configure(heartbeat_seconds: float | None) -> None:
    """Configure TF's coordination service with a ``heartbeat_seconds`` heartbeat timeout.

    Does nothing when ``heartbeat_seconds`` is None (TF's defaults), when this process already
    configured the service, or outside a multi-worker ``TF_CONFIG`` (one worker: MWMS starts no
    service).
    """
    if heartbeat_seconds is None:
        return
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver
    from tensorflow.python.eager import context

    if context.context().coordination_service is not None:
        return
    spec = TFConfigClusterResolver().cluster_spec()
    if "worker" not in spec.jobs or spec.num_tasks("worker") < 2:
        return
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(
                name="worker", num_tasks=spec.num_tasks("worker")
            )
        ],
        heartbeat_timeout_in_ms=max(1, int(heartbeat_seconds * 1000)),
    )
    log.debug("TF's coordination service: heartbeat timeout %s s", heartbeat_seconds)


def heartbeat_timeout_seconds() -> float | None:
    """The heartbeat timeout this process configured, in seconds (None: TF's default)."""
    from tensorflow.python.eager import context

    config = context.context().coordination_service
    if config is None or not config.heartbeat_timeout_in_ms:
        return None
    return config.heartbeat_timeout_in_ms / 1000
