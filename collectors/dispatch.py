"""``Collector(..., num_collectors=N, sync=..., backend=...)``: TorchRL's one entry point for process collectors,
answered with tdcollect's MultiSync / MultiAsync collectors (``backend="ray"``: its RayCollector)."""
from __future__ import annotations


def process_collector(args: tuple, kwargs: dict, backend, num_collectors, sync):
    """The collector ``Collector(*args, backend=..., num_collectors=..., sync=..., **kwargs)`` stands for:
    ``sync=True`` a :class:`~tdcollect.collectors.MultiSyncCollector`, else (TorchRL's default) a
    :class:`~tdcollect.collectors.MultiAsyncCollector`, with ``num_collectors`` workers (one env constructor
    each: a list of them, or one repeated). ``backend="ray"``: a :class:`~tdcollect.collectors.RayCollector` with
    ``num_collectors`` actors; it gathers every actor's share into each batch, so it needs ``sync=True``."""
    if backend not in (None, "process", "ray"):
        raise ValueError(f"Collector: backend={backend!r} is not supported; tdcollect's collectors are "
                         "backend='process' (worker processes) and backend='ray' (Ray actors, RayCollector).")
    if num_collectors is not None and (isinstance(num_collectors, bool) or not isinstance(num_collectors, int)
                                       or num_collectors < 1):
        raise ValueError(f"Collector: num_collectors must be a positive int, got {num_collectors!r}.")
    if sync is not None and not isinstance(sync, bool):
        raise TypeError(f"Collector: sync must be True, False or None, got {sync!r}.")
    if backend == "ray" and not sync:
        raise ValueError("Collector: backend='ray' gives tdcollect's RayCollector, which gathers every actor's share "
                         "into each batch: pass sync=True (sync=False, TorchRL's default, would yield one actor's "
                         "batch at a time; for that, use backend='process', a MultiAsyncCollector).")
    args, kwargs = list(args), dict(kwargs)
    create_env_fn = args.pop(0) if args else kwargs.pop("create_env_fn")
    if isinstance(create_env_fn, (list, tuple)):
        if num_collectors is not None and num_collectors != len(create_env_fn):
            raise ValueError(f"Collector: num_collectors={num_collectors} but {len(create_env_fn)} env "
                             "constructors were given; pass one per collector.")
        fns = list(create_env_fn)
    else:
        fns = [create_env_fn] * (num_collectors or 1)
    if backend == "ray":
        from .distributed.ray import RayCollector as cls
    elif sync:
        from .multi_sync import MultiSyncCollector as cls
    else:
        from .multi_async import MultiAsyncCollector as cls
    return cls(fns, *args, **kwargs)
