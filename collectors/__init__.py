"""Collectors that step policies against tdcollect (or TorchRL) envs and yield TorchRL-ready batches."""
from .multi_async import AsyncCollector, MultiAsyncCollector
from .multi_sync import MultiSyncCollector
from .single import Collector

__all__ = ["AsyncCollector", "Collector", "MultiAsyncCollector", "MultiSyncCollector", "RayCollector"]


def __getattr__(name):
    # RayCollector needs the optional ray package (pip install "tdcollect[ray]"): imported on first use, so
    # that importing collectors never imports collectors.ray
    if name == "RayCollector":
        from .ray import RayCollector

        return RayCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
