"""SerialEnv: ``num_envs`` envs stepped one after the other in this process, as one batched TorchRL env."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .batched import BatchedEnv, built_again, own_class
from .engine.group import EnvGroup, build_group
from .engine.platform_policy import built_on_cpu
from .engine.shared import allocate_buffers
from .engine.specs import check_same_specs
from .factories import bind_kwargs, check_torchrl_options, constructors_and_kwargs
from .libs import registered

#: TorchRL arguments about processes, which a SerialEnv has none of
_SERIAL_NO_OPS = frozenset({"mp_start_method", "num_threads", "num_sub_threads", "serial_for_single", "daemon",
                            "shutdown_timeout"})


class SerialEnv(BatchedEnv):
    """``num_envs`` envs in the calling process, batch size ``[num_envs]``.

    Args:
        num_envs: how many envs.
        create_env_fn: a constructor (or a list of ``num_envs`` constructors) returning a ``gymnasium.Env``
            or an unbatched TorchRL ``EnvBase``.
        create_env_kwargs: keyword arguments for the constructor(s): a dict or a list of dicts.
        owner: the name error messages give this env (default ``"SerialEnv"``; a collector that wraps your
            env in a SerialEnv gives its own name).
        check_actions, check_values: as for :class:`~tdcollect.envs.ParallelEnv`.
        device, torchrl_options: TorchRL's batched-env arguments, accepted as ``ParallelEnv`` accepts them.

    Its data equals a :class:`~tdcollect.envs.ParallelEnv` of the same constructors, seeds and actions, bit for bit.
    """

    @built_on_cpu
    def __init__(
        self,
        num_envs: int,
        create_env_fn: Callable | Sequence[Callable],
        create_env_kwargs: dict | Sequence[dict] | None = None,
        *,
        owner: str | None = None,
        check_actions: bool | str = True,
        check_values: bool = False,
        device=None,
        **torchrl_options,
    ):
        owner = owner or "SerialEnv"
        options = {k: v for k, v in torchrl_options.items() if k not in _SERIAL_NO_OPS}
        device = check_torchrl_options(owner, device, options)
        self.create_env_fn, self.create_env_kwargs = constructors_and_kwargs(
            create_env_fn, num_envs, create_env_kwargs, owner, "num_envs")
        self._adopt(build_group(bind_kwargs(self.create_env_fn, self.create_env_kwargs), owner, registered()), owner,
                    check_actions, device)
        self.check_values = bool(check_values)
        #: the arguments it was built with (a pickle of it is built again with them: ``__reduce__``)
        self._arguments = dict(num_envs=num_envs, create_env_fn=create_env_fn, create_env_kwargs=create_env_kwargs,
                               owner=owner, check_actions=check_actions, check_values=check_values, device=device,
                               **torchrl_options)

    def __reduce__(self):
        """What a pickle of it holds: its class, constructors and arguments; unpickled, a new SerialEnv of the same
        constructors (the envs' state does not travel, as with TorchRL's). One over envs built elsewhere
        (:meth:`of_group`) has no constructors: it cannot be pickled."""
        if self.create_env_fn is None:
            raise TypeError(f"{self.owner}: a SerialEnv over envs built elsewhere cannot be pickled (it has no "
                            "constructors to build them again from).")
        return built_again, (own_class(self), self._arguments)

    @classmethod
    def of_group(cls, group: EnvGroup, owner: str) -> SerialEnv:
        """A SerialEnv over envs already built (a ParallelEnv worker's, under its ``worker_transform``): batch
        ``[len(group)]``, actions unchecked (its caller checked them); closing it closes them. It cannot start
        them again (it has no constructors)."""
        env = cls.__new__(cls)
        env.create_env_fn = env.create_env_kwargs = None
        env._adopt(group, owner, False, None)
        return env

    def _adopt(self, group: EnvGroup, owner: str, check_actions: bool | str, device) -> None:
        self.num_workers = len(group)
        self._group = group
        buffers = allocate_buffers(group.specs, len(group), shared=False)
        group.bind(buffers)
        super().__init__(group.specs, len(group), buffers, check_actions=check_actions, owner=owner, device=device)

    def _start_again(self):
        if self.create_env_fn is None:
            raise RuntimeError(f"{self.owner}: these envs were built elsewhere and cannot be started again here.")
        group = build_group(bind_kwargs(self.create_env_fn, self.create_env_kwargs), self.owner, registered())
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

    def _run_step(self, mask: np.ndarray | None = None) -> list | None:
        return self._group.step(mask)

    def _run_reset(self, mask: np.ndarray | None) -> list | None:
        return self._group.reset(None if mask is None else mask.reshape(self.num_envs, -1))

    def _run_set_seed(self, seed: int | None, static_seed: bool, episodes: bool = False) -> int | None:
        return self._group.set_seed(seed, static_seed, episodes)

    def _run_env_attribute(self, path: tuple[str, ...], op: str, args: tuple, kwargs: dict | None) -> list:
        return self._group.env_attribute(path, op, args, kwargs)

    def release(self) -> None:
        """Close this SerialEnv but not its envs: they stay open, the caller's (a collector that wrapped one env
        instance and steps it as it is after all, see ``collectors/worker.py``)."""
        self._group.release()
        self.close()

    def _shutdown(self) -> None:
        self._group.close()
