"""TorchRL's ``enable_profile``: ``torch.profiler`` traces of a collector's rollouts (one rollout = the steps of one
batch), written where the rollouts run — the main process for ``Collector``, the chosen workers for the process
collectors. The settings are TorchRL's own ``ProfileConfig`` (validation, ``{worker_idx}`` in ``save_path``)."""
from __future__ import annotations

import torch


def profile_config(owner: str, started: bool, **settings):
    """TorchRL's ``ProfileConfig(**settings)``, refused once the collector has started iterating."""
    from torchrl.collectors import ProfileConfig

    if started:
        raise RuntimeError(f"{owner}: Cannot enable profiling after iteration has started; call enable_profile() "
                           "before the first batch.")
    return ProfileConfig(**{key: value for key, value in settings.items() if value is not None})


class RolloutProfiler:
    """Runs the profiler over rollouts ``warmup_rollouts .. num_rollouts - 1`` (``before`` / ``after`` each
    rollout), then exports the trace (Chrome format at the config's path, or to its ``on_trace_ready``)."""

    def __init__(self, config, worker_idx: int):
        self.config = config
        self.worker_idx = worker_idx
        self.rollouts = 0
        self.active = None

    def before(self) -> None:
        if self.active is None and self.rollouts == self.config.warmup_rollouts:
            config = self.config
            self.active = torch.profiler.profile(activities=config.get_activities(), record_shapes=config.record_shapes,
                                                 profile_memory=config.profile_memory, with_stack=config.with_stack,
                                                 with_flops=config.with_flops)
            self.active.__enter__()

    def after(self) -> None:
        self.rollouts += 1
        if self.active is not None and self.rollouts >= self.config.num_rollouts:
            self.close()

    def close(self) -> None:
        """Stop a profile under way and export it (fewer rollouts than asked, at shutdown)."""
        active, self.active = self.active, None
        if active is None:
            return
        active.__exit__(None, None, None)
        if self.config.on_trace_ready is not None:
            self.config.on_trace_ready(active)
        else:
            path = self.config.get_save_path(self.worker_idx)
            path.parent.mkdir(parents=True, exist_ok=True)
            active.export_chrome_trace(str(path))
