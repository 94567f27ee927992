"""Collectors that step policies against tdcollect (or TorchRL) envs and yield TorchRL-ready batches."""
from .multi_sync import MultiSyncCollector
from .single import Collector

__all__ = ["Collector", "MultiSyncCollector"]
