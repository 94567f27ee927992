"""Collectors that step policies against tdcollect (or TorchRL) envs and yield TorchRL-ready batches.

Faces: ``single.py`` (Collector), ``multi_sync.py`` / ``multi_async.py`` (process collectors on ``multi_base.py``),
``distributed/ray.py``, ``dispatch.py`` (``Collector(num_collectors=...)``).
Shared by all: ``base.py`` (iteration, TorchRL's
per-batch steps, checkpoints), ``loop.py`` (the step loop, in-process or in a worker), ``worker.py`` (envs as the
collectors take them, the workers' process body), ``options.py`` (TorchRL's arguments, refused ones with reasons),
``policies.py`` / ``policy_transforms.py``, ``weights.py``, ``stats.py`` (trajectory ids), ``trajectories.py``
(``trajs_per_batch``), ``buffer_writes.py`` (replay buffers), ``remote_calls.py`` / ``profiling.py`` (``map_fn``,
``enable_profile``).
"""
from .multi_async import AsyncCollector, MultiAsyncCollector
from .multi_sync import MultiSyncCollector
from .single import Collector

__all__ = ["AsyncCollector", "Collector", "MultiAsyncCollector", "MultiSyncCollector", "RayCollector"]


def __getattr__(name):
    # RayCollector needs the optional ray package (pip install "tdcollect[ray]"): imported on first use, so
    # that importing collectors never imports ray
    if name == "RayCollector":
        from .distributed.ray import RayCollector

        return RayCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
