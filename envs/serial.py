"""SerialEnv: ``num_envs`` envs stepped one after the other in this process, as one batched TorchRL env."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .batched import BatchedEnv
from .factories import resolve_factories
from .group import EnvGroup
from .shared import allocate_buffers
from .specs import check_same_specs


class SerialEnv(BatchedEnv):
    """``num_envs`` envs in the calling process, batch size ``[num_envs]``.

    Args:
        num_envs: how many envs.
        create_env_fn: a constructor (or a list of ``num_envs`` constructors) returning a ``gymnasium.Env``
            or an unbatched TorchRL ``EnvBase``.
        create_env_kwargs: keyword arguments for the constructor(s): a dict or a list of dicts.
        owner: the name error messages give this env (default ``"SerialEnv"``; a collector that wraps your
            env in a SerialEnv gives its own name).

    Its data equals a :class:`~tdcollect.envs.ParallelEnv` of the same constructors, seeds and actions, bit for bit.
    """

    def __init__(
        self,
        num_envs: int,
        create_env_fn: Callable | Sequence[Callable],
        create_env_kwargs: dict | Sequence[dict] | None = None,
        *,
        owner: str | None = None,
    ):
        owner = owner or "SerialEnv"
        self._factories = resolve_factories(create_env_fn, num_envs, create_env_kwargs, owner, "num_envs")
        self._group = EnvGroup(self._factories, owner=owner)
        buffers = allocate_buffers(self._group.specs, num_envs, shared=False)
        self._group.bind(buffers)
        super().__init__(self._group.specs, num_envs, buffers, owner=owner)

    def _start_again(self):
        group = EnvGroup(self._factories, owner=self.owner)
        try:
            check_same_specs({"the first start's envs": self._env_specs, "the restarted envs": group.specs},
                             "Constructors must build the same envs every time.")
        except BaseException:
            group.close()
            raise
        buffers = allocate_buffers(group.specs, self.num_envs, shared=False)
        group.bind(buffers)
        self._group = group
        return buffers

    def _run_step(self) -> None:
        self._group.step()

    def _run_reset(self, mask: np.ndarray | None) -> None:
        self._group.reset(mask)

    def _run_set_seeds(self, seeds: list[int]) -> None:
        self._group.set_seeds(seeds)

    def _shutdown(self) -> None:
        self._group.close()
