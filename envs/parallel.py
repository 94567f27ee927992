"""ParallelEnv: envs in worker processes that exchange data through shared-memory buffers."""
from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .batched import BatchedEnv, built_again, own_class
from .engine.errors import (
    ArgumentError,
    SharedMemoryError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    failures_of,
)
from .engine.handshake import BufferHandshake
from .engine.platform_policy import CALLER_THREADS, built_on_cpu, exit_if_bootstrapping, resolve_start_method
from .engine.pool import WorkerPool
from .engine.protocol import CALL, OUTPUT_SLOTS, PARTIAL_STEP, RESET, SLOT_STEP, STEP
from .engine.recycle import OutputSlots, numpy_of
from .engine.shared import allocate_copies
from .engine.values import check_finite
from .engine.worker import run_env_worker
from .engine.worker_rollout import WorkerRollouts
from .factories import PARALLEL_DEPRECATED, PickledFactory, bind_kwargs, check_torchrl_options, constructors_and_kwargs
from .inputs import leaf_copier, plain_tensordict
from .libs import registered
from .worker_transforms import WorkerTransform


class ParallelEnv(BatchedEnv):
    """``num_workers`` processes with ``envs_per_worker`` envs each; batch size ``[num_workers * envs_per_worker]``.

    Env ``i`` lives in worker ``i // envs_per_worker``. Every env is built inside its worker, never here.

    Args:
        num_workers: number of worker processes.
        create_env_fn: a constructor returning a ``gymnasium.Env`` or an unbatched TorchRL ``EnvBase``, or a
            list of ``num_workers`` constructors (one per worker). Not an env instance.
        create_env_kwargs: keyword arguments for the constructor(s): a dict, or a list of dicts (per worker).
        envs_per_worker: envs stepped one after the other inside each worker.
        mp_start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default :func:`default_start_method`.
            The global start method is never read nor changed.
        timeout: seconds a worker may take for one command before :class:`~tdcollect.envs.errors.WorkerTimeoutError`.
        check_actions: check actions against ``action_spec`` before sending them: shapes, and casts to the spec's
            dtype that would change a value (``ValueError``); values outside the spec go to the envs unchanged,
            as in TorchRL, with a ``UserWarning`` (``"raise"``: a ``ValueError``, nothing sent; False: unchecked).
        check_values: opt-in (default False): after every step and reset, a NaN or infinite observation or
            reward is a ``ValueError`` naming the env and the key (``check_env_specs`` for a training run).
            Always checked, whatever this says: shapes, ``None``, and values that the buffer's dtype cannot hold.
        max_restarts: how many times in all a worker that died, hung or raised may be replaced by a fresh one
            (opt-in; default 0). Its envs come back reset; in the step that failed they are marked
            ``truncated`` (and ``done``) with the reset observation as ``("next", obs)`` and reward 0; the other
            workers' data is untouched. A warning is issued and ``restarts`` counts them per worker.
        spin_s: seconds the main process and the workers poll for each other before blocking (see
            ``pool.py``). Default None: 1 ms up to two workers per usable core, else 0 (block at once: more
            pollers than that slow the workers down; ``platform_policy.SPIN_WORKERS_PER_CORE``).
        pipeline: deprecated, without effect (a ``FutureWarning`` when given): random-action rollouts are
            recorded by the workers themselves (see ``worker_rollout.py``), which the pipelined rollouts it chose
            were a step towards.
        device: where the specs and outputs live (default: the CPU); e.g. ``"cuda"``: each output is copied there
            from the shared CPU buffers, where the envs step (``BatchedEnv.to``).
        owner: who this env is in messages, errors and worker process names (default: the class name; the
            gymnasium and SB3 faces pass theirs).
        counted_workers: the workers this process' torch threads are lowered by while the env runs (default:
            ``num_workers``, as TorchRL's ``ParallelEnv``). ``tdcollect run`` passes a script's
            ``ParallelEnv(N, ...)`` count here when it lays the N envs out over fewer workers: the script's main
            process runs TorchRL's threads, so its own computations (a policy, a loss) give TorchRL's numbers on
            any number of cores.
        worker_transform: a TorchRL ``Transform`` (or a function returning one) that each worker runs on its
            ``[envs_per_worker]`` envs right after they step: the data of ``TransformedEnv(ParallelEnv(...),
            transform)``, with the per-frame work in the workers (see ``worker_transforms.py``; the specs are the
            transformed env's). ``VecNorm`` is refused there: append it in this process.

    Errors from workers arrive as :class:`~tdcollect.envs.errors.EnvWorkerError` (an exception in an env),
    :class:`~tdcollect.envs.errors.WorkerDiedError` and :class:`~tdcollect.envs.errors.WorkerTimeoutError`; after the
    last two the env is closed.
    """

    #: whether this process's torch threads are lowered by one per worker while the workers run (TorchRL's
    #: ParallelEnv does so); the gymnasium and SB3 faces leave their callers' threads alone
    adjusts_caller_threads = True
    _out: OutputSlots | None = None  # the output slots (see _run_step; a view has none: its parent steps)

    def __new__(cls, num_workers: int = 1, *args, serial_for_single: bool = False, **kwargs):
        if serial_for_single and num_workers == 1:  # TorchRL's option: one env needs no worker process
            from .serial import SerialEnv

            create_env_fn = args[0] if args else kwargs.pop("create_env_fn")
            create_env_kwargs = args[1] if len(args) > 1 else kwargs.pop("create_env_kwargs", None)
            return SerialEnv(1, create_env_fn, create_env_kwargs, check_actions=kwargs.get("check_actions", True),
                             device=kwargs.get("device"))
        return super().__new__(cls)

    @built_on_cpu
    def __init__(
        self,
        num_workers: int,
        create_env_fn: Callable | Sequence[Callable],
        create_env_kwargs: dict | Sequence[dict] | None = None,
        *,
        envs_per_worker: int = 1,
        mp_start_method: str | None = None,
        timeout: float = 120.0,
        check_actions: bool | str = True,
        check_values: bool = False,
        max_restarts: int = 0,
        spin_s: float | None = None,
        device=None,
        num_threads: int | None = None,
        num_sub_threads: int = 1,
        serial_for_single: bool = False,
        daemon: bool = False,
        shutdown_timeout: float = 2.0,
        owner: str | None = None,
        worker_transform=None,
        counted_workers: int | None = None,
        **torchrl_options,
    ):
        exit_if_bootstrapping()
        owner = owner or type(self).__name__
        device = check_torchrl_options(owner, device, torchrl_options, PARALLEL_DEPRECATED)
        fns, kwargs = constructors_and_kwargs(create_env_fn, num_workers, create_env_kwargs, owner, "num_workers")
        if not isinstance(envs_per_worker, int) or envs_per_worker < 1:
            raise ArgumentError(f"ParallelEnv needs envs_per_worker >= 1 (an int), got {envs_per_worker!r}.")
        for name, value in (("num_threads", num_threads), ("num_sub_threads", num_sub_threads),
                            ("counted_workers", counted_workers)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ArgumentError(f"{owner}: {name} must be an int >= 1, got {value!r}.")
        method = resolve_start_method(mp_start_method)
        #: the arguments it was built with (see ``worker_transforms.move_transforms_to_workers``)
        self._arguments = dict(num_workers=num_workers, create_env_fn=create_env_fn,
                               create_env_kwargs=create_env_kwargs, envs_per_worker=envs_per_worker,
                               mp_start_method=mp_start_method, timeout=timeout, check_actions=check_actions,
                               check_values=check_values, max_restarts=max_restarts, spin_s=spin_s, device=device,
                               num_threads=num_threads, num_sub_threads=num_sub_threads, daemon=daemon,
                               shutdown_timeout=shutdown_timeout, owner=owner, counted_workers=counted_workers,
                               **torchrl_options)
        self.__dict__["worker_transform"] = worker_transform  # as given; not a submodule of this env (EnvBase is one)
        self._wrap = None if worker_transform is None else WorkerTransform(worker_transform, owner)
        self.create_env_fn = fns
        self.create_env_kwargs = kwargs
        self.num_workers = num_workers
        self.counted_workers = counted_workers or num_workers
        self.envs_per_worker = envs_per_worker
        self.start_method = self._mp_start_method = method
        self.timeout = float(timeout)
        self.max_restarts = int(max_restarts)
        self.num_threads = num_threads
        self.num_sub_threads = num_sub_threads
        self.serial_for_single = serial_for_single
        self.daemon = daemon
        num_envs = num_workers * envs_per_worker
        self._handshake = BufferHandshake(num_envs)
        self._pool_options = dict(start_method=method, timeout=timeout, owner=owner, spin_s=spin_s, daemon=daemon,
                                  shutdown_timeout=shutdown_timeout)
        self._out = OutputSlots()  # see _run_step
        self._posts: dict[int, dict] = {}  # see take_posts
        self._begun: list[tuple | None] = [None]  # see begin (a list: setting an attribute costs microseconds)
        self.worker_rollouts = WorkerRollouts(self)  # rollouts with random actions (see worker_rollout.py)
        self._start_pool()
        try:
            super().__init__(self._handshake.specs, num_envs, self._handshake.buffers, check_actions=check_actions,
                             owner=owner, device=device)
        except BaseException:
            self._shutdown()
            raise
        self.check_values = bool(check_values)

    def __reduce__(self):
        """What a pickle of it holds (how TorchRL's process collectors and tdcollect's send a batched env instance
        to their workers): its class, constructors and arguments. Unpickled, it is a new env of the same
        constructors, started there; the envs' state (episodes, seeds) does not travel, as with TorchRL's."""
        arguments = {**self._arguments, "worker_transform": self.__dict__["worker_transform"]}
        return built_again, (own_class(self), arguments)

    def with_worker_transform(self, transform) -> ParallelEnv:
        """A ParallelEnv built with this one's constructors and arguments whose workers run ``transform`` (see
        ``worker_transform``); this one is closed. (:func:`~tdcollect.envs.move_transforms_to_workers` calls it.)"""
        if type(self) is not ParallelEnv:
            raise ArgumentError(f"{self.owner}: only a ParallelEnv is built again with a worker transform here; pass "
                                f"worker_transform= to {type(self).__name__}(...) instead.")
        moved = ParallelEnv(**self._arguments, worker_transform=transform)
        self.close()
        return moved

    def _start_pool(self) -> None:
        """Start the workers with the current constructors and kwargs (see ``update_kwargs``); the handshake
        leaves the shared buffers and the reset mask in ``_handshake``. As TorchRL's ParallelEnv, this process
        then runs ``num_threads`` torch threads (default: its current count less one per worker, at least 1),
        given back when the workers stop."""
        owner = self._pool_options["owner"]
        k = self.envs_per_worker
        pickled = [PickledFactory(fn, owner, f"worker {w}")
                   for w, fn in enumerate(bind_kwargs(self.create_env_fn, self.create_env_kwargs))]
        families = registered()
        args = [(factory, k, w * k, families, self.num_sub_threads, self._wrap) for w, factory in enumerate(pickled)]
        try:
            self._pool = WorkerPool(run_env_worker, args, handshake=self._handshake,
                                    preload=set().union(*(f.imports for f in pickled)), **self._pool_options)
        except BaseException:
            self._handshake.release()
            raise
        self._reset_mask = self._handshake.reset_tensor.numpy().reshape(-1)  # one flag per element
        self._step_mask = self._handshake.step_tensor.numpy()
        if self.num_threads or self.adjusts_caller_threads:
            CALLER_THREADS.take(self, self.counted_workers, self.num_threads)

    @property
    def spin_s(self) -> float:
        """Seconds this process and the workers poll for each other before blocking; settable at any time."""
        return self._pool.spin_s

    @spin_s.setter
    def spin_s(self, seconds: float) -> None:
        self._pool.spin_s = seconds  # checked there
        self._pool_options["spin_s"] = self._pool.spin_s  # a restart keeps it

    def _start_again(self):
        self._start_pool()
        return self._handshake.buffers

    # ----------------------------------------------------------------- commands
    def _run_step(self, mask: np.ndarray | None = None) -> list | None:
        """While callers take each step's outputs (``step_and_maybe_reset``, ``step``: see ``_bind_copiers``), a full
        step fills a free output slot (``SLOT_STEP``) which the outputs hand out: this process copies no frame. (A
        rollout reads the buffers itself: its steps fill none, after the first.)"""
        out = self._out
        out.filled = None
        if mask is None:
            p = self._free_slot() if out.wanted else None
            out.wanted = False
            if p is None:
                return self._run_and_gather(STEP, list(range(self.num_workers)))
            replies = self._run_and_gather(SLOT_STEP[p], list(range(self.num_workers)))
            if out.restarts == self._pool.restarts:  # no worker was replaced during the step: the slot holds it all
                out.filled = p
            return replies
        return self._run_and_gather(*self._command("step", mask))

    def _command(self, command: str, mask: np.ndarray | None) -> tuple[int, list[int]]:
        """``(code, workers)`` of a ``"step"`` or ``"reset"`` of the envs (elements) where ``mask`` is True (None:
        all), its mask written for the workers."""
        if command == "step" and mask is None:
            return STEP, list(range(self.num_workers))
        rows = self._reset_mask if command == "reset" else self._step_mask
        rows[:] = True if mask is None else mask
        workers = np.flatnonzero(rows.reshape(self.num_workers, -1).any(1)).tolist()
        return (RESET if command == "reset" else PARTIAL_STEP), workers

    # ----------------------------------------------------------------- begun commands
    def begin(self, command: str, mask: np.ndarray | None = None, call: tuple = ()) -> None:
        """Begin ``command`` on the workers and return at once (the facades' ``*_async``); :meth:`finish` waits for it
        and completes it as the blocking call does: ``"step"`` as :meth:`step_buffers` (``mask``: bool ``[num_envs]``,
        the envs to step), ``"reset"`` of every env or element (``mask``: bool ``[num_envs * prod(B)]``, those to
        reset), ``"call"`` as :meth:`env_attribute` (``call = (path, op, args, kwargs)``). Nothing else may run
        on this env meanwhile."""
        self._pool.check_open()
        if command not in ("step", "reset", "call"):
            raise ValueError(f"{self.owner}.begin() takes 'step', 'reset' or 'call', got {command!r}.")
        if self._begun[0] is not None:
            raise RuntimeError(f"{self.owner}: the {self._begun[0][0]} it began is not finished; call finish().")
        if not self._touched_since_start:  # (see _step_envs)
            self._touched_since_start = True
        self._out.filled = None  # (the next outputs are copied from the buffers)
        if command == "call":
            code = CALL
            workers = list(range(self.num_workers))
            self._pool.call("env_attribute", [call] * len(workers), workers, wait=False)
        else:
            code, workers = self._command(command, mask)
            self._pool.send(code, workers)
        self._begun[0] = (command, code, workers, mask, call)

    def finish(self, timeout: float | None = None) -> list | None:
        """Wait for the command :meth:`begin` began and complete it: a call's results (one per env), None for a
        step or a reset. After ``timeout`` s, ``multiprocessing.TimeoutError``: the command goes on (call
        ``finish`` again). Failed workers are handled as in the blocking calls (see ``max_restarts``)."""
        if self._begun[0] is None:
            raise RuntimeError(f"{self.owner}.finish() was called with no command begun; call begin() first.")
        command, code, workers, mask, call = self._begun[0]
        try:
            answers = self._run(self._pool.wait_for, workers, code, timeout, stepping=command == "step")
        finally:
            if not isinstance(sys.exc_info()[1], multiprocessing.TimeoutError):  # (a timeout: it goes on)
                self._begun[0] = None
        if command == "call":  # (None: a worker was replaced on the way, it is asked again)
            return [v for values in answers for v in values] if answers is not None else self._run_env_attribute(*call)
        objects = self._kept(workers, answers)
        if objects:  # (envs with non-tensor entries)
            self._objects.keep(objects)
        if command == "step":
            self._after_step(mask)
        else:
            self._pending_reset[slice(None) if mask is None else mask] = False
            if self.check_values:
                check_finite(self._root, self.owner, "reset()")

    def _bind_copiers(self) -> None:
        """As ``BatchedEnv``'s; on the CPU, with "next" leaves of ``recycler.min_bytes`` or more (with a numpy dtype:
        frames), the copiers of the next buffer hand out the slot the step filled (and note that the outputs are
        wanted: the next step fills a slot). Other envs (small leaves only) keep the plain copiers."""
        super()._bind_copiers()
        out = self._out
        copy_leaves = self._copy_next_leaves
        if out is None or copy_leaves is None or self._cast is not None:  # (a view: no slots of its own)
            return
        out.keys = [key for key, value in self._next.items()  # (all top-level tensors: copy_leaves exists)
                    if value.numel() * value.element_size() >= self.recycler.min_bytes and numpy_of(value) is not None]
        if not out.keys:
            return

        def next_leaves() -> dict:
            p, out.filled, out.wanted = out.filled, None, True
            return copy_leaves() if p is None else out.leaves(p)

        batch_size = self._next.batch_size
        self._copy_next_leaves = next_leaves
        self._copy_next = lambda: plain_tensordict(next_leaves(), batch_size)

    def _free_slot(self) -> int | None:
        """A free output slot (the slots made and given to the workers first, again to workers replaced since), or
        None: none free, or nothing to hand out (no big leaf, outputs on a device, /dev/shm full)."""
        out = self._out
        if not out.made:  # (also after a fork: see recycle.OutputSlots)
            self._make_slots()
        if out.buffers is None or self._cast is not None:
            return None
        out.restarts = self._bind_in_workers("bind_slots", out.buffers, out.restarts)
        return out.free()

    def _make_slots(self) -> None:
        """Output slots in shared memory for the leaves ``_out.keys`` (none when ``/dev/shm`` cannot hold them: the
        outputs are then copied)."""
        out = self._out
        big = self._out.keys
        out.forget()  # (older slots, e.g. before a fork, are never filled again)
        out.made = True
        if not self._flat_keys:
            return
        try:
            buffers = allocate_copies(self._step_buffers.select(*[("next", key) for key in big]), OUTPUT_SLOTS,
                                      "the output slots of step_and_maybe_reset")
        except SharedMemoryError:
            return
        out.hold(buffers, big, list(self._next.keys()), leaf_copier(self._next.exclude(*big), self.recycler))

    def _bind_in_workers(self, call: str, buffers, bound: list | None) -> list:
        """``call(buffers, its rows)`` in each worker, unless ``bound`` (the pool's ``restarts`` when they last got
        them) is current; again while a worker is replaced during the call. Returns the ``restarts`` now bound."""
        k = self.envs_per_worker
        while bound != self._pool.restarts:
            bound = list(self._pool.restarts)
            self._run(self._pool.call, call, [(buffers, slice(w * k, (w + 1) * k)) for w in range(self.num_workers)])
        return bound

    def _run_and_gather(self, code: int, workers: list[int]) -> list | None:
        """Run ``code`` on ``workers``: the non-tensor entries they answered with, as ``[(env index, entries)]``
        (None without any); what their envs posted is kept for :meth:`take_posts`."""
        return self._kept(workers, self._run(self._pool.run, code, workers, stepping=code != RESET))

    def _kept(self, workers: list[int], answers: list | None) -> list | None:
        if not answers:  # (the common case: no worker answered)
            return None
        k = self.envs_per_worker
        objects = []
        for w, answer in zip(workers, answers):
            if answer is not None:
                entries, posts = answer
                objects.extend((w * k + i, value) for i, value in entries or ())
                for i, values in posts or ():
                    self._posts.setdefault(w * k + i, {}).update(values)
        return objects or None

    def take_posts(self) -> dict[int, dict]:
        """``{env index: dict}``: what the envs posted (see ``EnvGroup.take_posts``) since the last call, merged per
        env (a later value of a key replaces an earlier one); then forgotten."""
        taken = dict(self._posts)  # (emptied in place: setting an attribute, EnvBase.__setattr__, costs microseconds)
        self._posts.clear()
        return taken

    def _run_reset(self, mask: np.ndarray | None) -> list | None:
        return self._run_and_gather(*self._command("reset", mask))

    def _run_set_seed(self, seed: int | None, static_seed: bool, episodes: bool = False,
                      workers=None) -> int | None:
        for w in range(self.num_workers) if workers is None else workers:  # in order: each chains the seed on
            seed = self._run(self._pool.call, "set_seed", [(seed, static_seed, episodes)], [w])[0]
        return seed

    def _run_env_attribute(self, path: tuple[str, ...], op: str, args: tuple, kwargs: dict | None,
                           workers=None) -> list:
        workers = list(range(self.num_workers)) if workers is None else workers
        for _ in range(2):  # a worker replaced during the call (max_restarts) answers on the second try
            per_worker = self._run(self._pool.call, "env_attribute", [(path, op, args, kwargs)] * len(workers),
                                   workers)
            if per_worker is not None:
                return [value for values in per_worker for value in values]
        raise RuntimeError(f"{self.owner}: workers were replaced twice while answering a call to {path}.")

    # ----------------------------------------------------------------- indexing (see view.py)
    #: the class of the views ``env[...]`` returns, ``view_class(parent, item)``: view.py's ``WorkerView``, which
    #: builds on this module and sets it here when imported (this module does not import it: no circle)
    view_class: type | None = None

    def __getitem__(self, item) -> ParallelEnv:
        """``env[i]``, ``env[1:3]``, ``env[[0, 2]]``: a live view of those workers (see ``view.py``)."""
        self._ensure_open()
        return self.view_class(self, item)

    def __setitem__(self, item, value) -> None:
        raise NotImplementedError("writing an env into a ParallelEnv (snapshot writeback) is not supported: its envs "
                                  "are built in their workers from constructors; use update_kwargs() and restart it.")

    def _run(self, fn, *args, stepping: bool = False):
        """Run a pool command. Failed workers are replaced while ``max_restarts`` allows (then the command's
        result stands, see the class docstring); otherwise, when a worker died or hung, or on Ctrl-C, this
        env is closed before the error propagates."""
        try:
            return fn(*args)
        except WorkerError as err:
            self._recover(err, stepping)
        except KeyboardInterrupt:
            self.close()
            raise

    def _recover(self, err: WorkerError, stepping: bool) -> None:
        """Replace the workers behind ``err`` and reset their envs; when a step failed, write that step's
        "next" for them: the reset observation, reward 0, truncated and done. A failure on the way (a
        replacement dying in its start-up or its first reset) goes through the same restart budget."""
        replaced: set[int] = set()
        while True:
            workers, err = self._replace_within_budget(err)
            if workers is None:
                break
            replaced.update(workers)
            rows = self._reset_mask.reshape(self.num_workers, -1)  # a view: the worker's elements
            rows[:] = False
            rows[sorted(replaced)] = True
            try:
                self._objects.keep(self._kept(sorted(replaced), self._pool.run(RESET, sorted(replaced))))
            except WorkerError as again:
                err = again
                continue
            except BaseException:
                self.close()
                raise
            if stepping:
                self._write_restarted_step(torch.as_tensor(self._reset_mask).reshape(self.batch_size))
            return
        self._close_if_fatal(err)
        raise err

    def _replace_within_budget(self, err: WorkerError) -> tuple[list[int] | None, WorkerError]:
        """``(workers replaced, err)``: the workers behind ``err`` replaced while ``max_restarts`` allows (None
        when it does not, or this env is closed), a replacement failing in its start-up going through the same
        budget (``err`` is then the last failure). Anything else closes this env and propagates."""
        while True:
            try:
                return (None if self.is_closed else self._pool.replace_failed(err, self.max_restarts)), err
            except WorkerError as again:
                err = again
            except BaseException:
                self.close()
                raise

    def _close_if_fatal(self, err: WorkerError) -> None:
        """Close this env when a worker behind ``err`` died or hung (an exception raised by an env leaves the
        env usable)."""
        if any(isinstance(e, (WorkerDiedError, WorkerTimeoutError)) for e in failures_of(err).values()):
            self.close()

    def _write_restarted_step(self, rows: torch.Tensor) -> None:
        for key in self.full_observation_spec.keys(True, True):
            self._next.get(key)[rows] = self._root.get(key)[rows]
        for key in self.reward_keys:
            self._next.get(key)[rows] = 0
        for key in self.done_keys:
            name = key if isinstance(key, str) else key[-1]
            self._next.get(key)[rows] = name != "terminated"

    @property
    def restarts(self) -> list[int]:
        """How many times each worker was replaced (see ``max_restarts``)."""
        return list(self._pool.restarts)

    def _shutdown(self) -> None:
        self._pool.stop()
        self._begun[0] = None  # (a command begun and never finished is gone with the workers)
        self._reset_mask = self._step_mask = None
        self._out.forget()  # (the slots handed out stay valid: their memory lives as long as they do)
        self.worker_rollouts.forget()  # (as are the rollouts)
        self._handshake.release()
        CALLER_THREADS.give_back(self)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers."""
        return self._pool.pids
