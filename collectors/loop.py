"""BatchLoop: fills ``[n_envs, steps]`` batches from one batched env and a policy (an env with several batch
dims, e.g. ``[2, 3]``, is stepped in its shape and its batches are flattened to ``[6, steps]``).

It is the loop of :class:`~tdcollect.collectors.Collector` and of every
:class:`~tdcollect.collectors.MultiSyncCollector` worker. ``storage`` (allocated once, in shared memory for
the multi-process collector) holds one batch with the keys of a TorchRL rollout: the root (observation keys,
done flags), what the policy wrote ("action", log-probabilities, ...) and ``"next"`` (observation keys, reward,
done flags); time is the last batch dim.

With a tdcollect ``BatchedEnv`` (SerialEnv / ParallelEnv) a step is lean and goes through the env's buffer
API only: the policy reads the env's root buffer, its actions are copied into the env's action buffers, and
the env's step buffers are copied into the storage by a :class:`~tdcollect.envs.rollout.StepRecorder`; a
plain ``TensorDictModule`` policy (``UnwrappedModule``) is called on the buffer tensors themselves, so no
TensorDict is built per step. Any other TorchRL env goes through ``step_and_maybe_reset``.
Processes that only collect (the collector workers) pass ``inference_mode=True`` (``torch.inference_mode``,
cheaper per op than ``torch.no_grad``).
Consecutive batches continue the same episodes (the last root is carried over).
"""
from __future__ import annotations

import cloudpickle
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.envs import EnvBase, TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

from tdcollect.envs.batched import BatchedEnv
from tdcollect.envs.engine.recording import StepRecorder
from tdcollect.envs.engine.shared import in_shared_memory
from tdcollect.envs.engine.values import check_finite
from tdcollect.envs.inputs import COLLECTOR_ACTION_CHECKS, action_check, in_spec_shape
from tdcollect.envs.libs.envbase import check_entries, expected_entries, seeding_resets

from .policies import ActionSampler, RandomPolicy, UnwrappedModule, policy_module
from .profiling import RolloutProfiler
from .remote_calls import call_path, dump_env_transform, resolve
from .stacked import reshape_leading, stack_steps, stacking_reason
from .stats import done_leaves, ends_of
from .weights import policy_weights_of

DEFAULT_EXPLORATION_TYPE = ExplorationType.RANDOM


class BatchLoop:
    """``collect()`` fills ``storage`` with the next ``steps`` steps of ``env`` (see the module docstring).

    Options (as in TorchRL): ``reset_at_each_iter``, ``max_frames_per_traj``, ``exploration_type`` (the
    interaction type the policy runs under, default ``ExplorationType.RANDOM``: stochastic actors sample);
    ``check_actions`` (default True): every step's actions are checked against the action spec before they reach
    the envs: shape and dtype (a cast that would change them is a ``ValueError``), integer actions in range and
    floats finite (outside: a ``UserWarning``, and they reach the envs unchanged, as in TorchRL; ``"raise"``: a
    ``ValueError``; ``"bounds"``: continuous bounds too, raising); False: only the first step's shape and dtype;
    ``check_values`` (default False): a batch whose observations or rewards hold NaN or an infinity is a
    ``ValueError`` naming the env (its row) and the key; ``interruptor``: see ``preemption.py``.
    """

    def __init__(self, env: EnvBase, policy, steps: int, *, shared: bool = False, inference_mode: bool = False,
                 reset_at_each_iter: bool = False, max_frames_per_traj: int | None = None,
                 exploration_type: ExplorationType = DEFAULT_EXPLORATION_TYPE, check_actions: bool | str = True,
                 check_values: bool = False, interruptor=None, clear_device: bool = False):
        #: the env's TensorDicts reach the policy without a device (TorchRL's collector clears it when the env has
        #: none or the policy runs on another device; an env stepped as it is, outside the buffer path)
        self.clear_device = clear_device
        #: dynamic or non-tensor entries: the batches are the steps' TensorDicts stacked (see ``stacked.py``)
        self.stacked = stacking_reason(env) is not None
        if self.stacked and (len(env.batch_size) > 1 or isinstance(env, BatchedEnv) or max_frames_per_traj):
            raise ValueError(
                f"the env has {stacking_reason(env)}, so its batches are stacked step by step, which the collector "
                "does for a TorchRL env with at most one batch dim, without max_frames_per_traj (append a "
                "StepCounter transform to the env instead).")
        self.env = env
        self.policy = policy
        self.steps = steps
        self.n_envs = env.batch_size.numel()
        self.reset_at_each_iter = reset_at_each_iter
        self.max_frames_per_traj = max_frames_per_traj
        self.exploration_type = exploration_type
        self.check_actions = bool(check_actions)
        self.check_values = check_values
        #: what write_actions checks (see inputs.COLLECTOR_ACTION_CHECKS)
        self.action_check = action_check(check_actions, COLLECTOR_ACTION_CHECKS)
        self.grad_mode = torch.inference_mode if inference_mode else torch.no_grad
        #: TorchRL's interruptor (``collectors/preemption.py``): polled after each step; ``steps_taken`` of the last
        #: batch (the storage's later steps are left as they were)
        self.interruptor = interruptor
        self.steps_taken = steps
        self.traj_steps = torch.zeros(self.n_envs, dtype=torch.int64)  # steps of each env's running trajectory
        self.buffer_path = isinstance(env, BatchedEnv)
        self.random_actions = ActionSampler(env.full_action_spec)
        #: (key, batched shape) of each action whose spec has one shape (heterogeneous ones are left as they are)
        self._action_shapes = [(key, tuple(spec.shape)) for key, spec in env.full_action_spec.items(True, True)
                               if -1 not in spec.shape]
        self.pre_hook = self.post_hook = None  # see set_hooks
        self.profiler = None  # see enable_profile
        self.counter_keys: set = set()  # entries the loop writes itself (max_frames_per_traj's step counts)
        self.root = env.reset()
        self._first = True
        if self.stacked:
            self.buffer_path = False  # the last batch, once collected
            self.storage = None
            return
        template = self._template()
        env_shaped = template.unsqueeze(-1).expand(*env.batch_size, steps).clone()  # [*env batch, steps]
        if shared:
            in_shared_memory(env_shaped, f"the collector's batch storage ({self.n_envs} envs x {steps} steps)")
        self.views = env_shaped.unbind(-1)  # per step, in the env's batch shape
        #: ``[n_envs, steps]``: a view of the same memory (envs with several batch dims are flattened; an unbatched
        #: env's steps get a batch dim of one)
        self.storage = (env_shaped if len(env.batch_size) == 1
                        else reshape_leading(env_shaped, len(env.batch_size), (self.n_envs,)))
        self.storage_keys = list(self.storage.keys(True, True))
        #: the storage's leaves a step outside the buffer path copies in, per step (see _generic_step)
        self._copied_keys = [key for key in self.storage_keys if key not in self.counter_keys]
        try:
            self._leaves_at = [[view.get(key) for key in self._copied_keys] for view in self.views]
        except RuntimeError:  # entries of other shapes per agent (lazily stacked): no one leaf each, by key always
            self._leaves_at = None
        #: an unbatched TorchRL env stepped as it is (no buffers of its own): its outputs are checked here, as the
        #: engine checks them, before they are written into the storage (no broadcasting, no wrapping casts)
        self._output_checks = None
        if not self.buffer_path and not env.batch_size:
            observed = [*env.full_observation_spec.keys(True, True), *env.full_done_spec.keys(True, True)]
            rewarded = [*observed, *env.full_reward_spec.keys(True, True)]
            self._output_checks = (expected_entries(template, observed),
                                   expected_entries(template.get("next"), rewarded))
        self._done_leaves = done_leaves(self.storage)  # [n_envs, steps, ...] each
        if self.max_frames_per_traj:  # the step counts max_frames_per_traj writes, [n_envs, steps, 1] each
            self._step_counts = (self.storage.get("step_count"), self.storage.get(("next", "step_count")))
        if self.buffer_path:
            self._prepare_buffer_path()

    @property
    def root(self) -> TensorDictBase:
        """The env's current root TensorDict (what the policy reads next, outside the buffer path)."""
        return self._root

    @root.setter
    def root(self, td: TensorDictBase) -> None:
        if self.clear_device and td is not None:
            td.clear_device_()
        self._root = td

    def _template(self) -> TensorDictBase:
        """Zeros shaped like one step: the env's fake step plus whatever else the policy writes."""
        fake = self.env.fake_tensordict()
        # (the probe draws nothing from the caller's RNGs: TorchRL's collector makes no such call, and a sampling
        # policy's first actions must be the draws they are in TorchRL's collection)
        with torch.no_grad(), set_exploration_type(self.exploration_type), rngs_untouched():
            probe = self.policy(self.root.clone())
        extra = set(probe.keys(True, True)) - set(fake.keys(True, True))
        if extra:
            fake.update(probe.select(*extra).to("cpu").apply(torch.zeros_like))
        for key in self.env.action_keys:  # as TorchRL's, batches hold the actions the policy wrote, in its dtype
            try:
                wrote = probe.get(key, None)
                spec = fake.get(key)
            except RuntimeError:  # entries of heterogeneous shapes (lazily stacked) cannot be one tensor: as they are
                continue
            if wrote is not None and wrote.dtype != spec.dtype and wrote.shape == spec.shape:
                fake.set(key, torch.zeros(spec.shape, dtype=wrote.dtype))
        if self.max_frames_per_traj:  # what TorchRL's StepCounter adds
            if any("step_count" in ((key,) if isinstance(key, str) else key) for key in fake.keys(True, True)):
                raise ValueError("the env has a 'step_count' entry already (a StepCounter?), which "
                                 "max_frames_per_traj would add too: leave max_frames_per_traj unset or remove the "
                                 "env's StepCounter.")
            counts = torch.zeros(*self.env.batch_size, 1, dtype=torch.int64)
            flags = torch.zeros(*self.env.batch_size, 1, dtype=torch.bool)
            for key, value in (("step_count", counts), ("truncated", flags)):
                for where in (key, ("next", key)):
                    if where not in fake.keys(True, True):
                        fake.set(where, value.clone())
                        self.counter_keys.add(where)
        return fake

    def _rebind(self) -> None:
        """The env was closed (and maybe started again) since the last batch: start it, reset it and bind to
        its new buffers (its episodes start over)."""
        self.env.start()
        self.root = self.env.reset()
        self.traj_steps = torch.zeros(self.n_envs, dtype=torch.int64)
        self._prepare_buffer_path()

    def _prepare_buffer_path(self) -> None:
        env = self.env
        self._bound_root_buffer = env.root_buffer
        self.recorder = StepRecorder.of(env, self.storage)
        root = env.root_buffer
        root_set = set(self.recorder.root_keys)
        self.policy_keys = [k for k in self.storage_keys
                            if k not in root_set and not _is_next(k) and k not in self.counter_keys]
        self.action_keys = self.recorder.action_keys
        self.action_buffers = [buffer for _, buffer in env.action_buffers]
        self.policy_in = TensorDict({k: root.get(k) for k in self.recorder.root_keys}, batch_size=env.batch_size)
        # an UnwrappedModule reading root keys only is called on the root buffer's tensors
        self.direct_inputs = None
        if isinstance(self.policy, UnwrappedModule) and set(self.policy.in_keys) <= root_set:
            self.direct_inputs = [root.get(k) for k in self.policy.in_keys]
        leaves = {k: self.storage.get(k) for k in self.policy_keys}
        self.policy_outputs_at = [[leaves[k][:, t] for k in self.policy_keys] for t in range(self.steps)]

    def set_seed(self, seed: int, static_seed: bool = False, seed_process: bool = False) -> int:
        """Seed the envs (TorchRL's chain from ``seed``, see ``EnvGroup.set_seed``) and start the episodes the
        seeds start; returns the env's answer (the seed after its last env's). ``seed_process``: this process'
        torch and numpy RNGs are seeded with ``seed`` too, before the resets draw from them, as TorchRL's collector
        workers do (a worker process's own; never the caller's process: TorchRL's ``Collector.set_seed`` leaves
        its RNG alone, so the policy's draws there go on from where the user's seed left them).

        The episodes: TorchRL's collector steps on from the state the seeding left each env in, which for a
        ``GymEnv`` is the seeded episode's start (its seeding is a reset), yet its first step's ``"observation"``
        is the one it held from before the seed (a step that never happened). Here the batch starts at the
        seeded episode's start with that episode's observation (``BatchedEnv.seed_episodes``): the same data as
        TorchRL's but that first observation of each env."""
        out, reset_kwargs = seed_into_episodes(self.env, seed, static_seed)
        if seed_process:
            torch.manual_seed(seed)
            np.random.seed(seed)
        self.reset_envs(**reset_kwargs)
        return out

    # ------------------------------------------------ TorchRL's remote helpers (see remote_calls.py)
    worker_idx = None  # set by the process collector's worker

    @property
    def frames_per_batch(self) -> int:
        return self.n_envs * self.steps

    def call_method(self, path: str, args: tuple, kwargs: dict):
        """The callable at attribute ``path`` from this loop (``"env.set_seed"``), called: what the process
        collectors' ``map_fn`` runs in each worker (see ``remote_calls.py``)."""
        return call_path(self, path, args, kwargs)

    def get_distant_attr(self, path: str):
        return resolve(self, path)

    def _dump_env_transform(self, step: int | None = None) -> None:
        dump_env_transform(self.env, step)

    def enable_profile(self, config: bytes) -> None:
        """Profile the next rollouts as TorchRL's ``ProfileConfig`` (cloudpickled) says (see ``profiling.py``)."""
        self.profiler = RolloutProfiler(cloudpickle.loads(config), self.worker_idx or 0)

    def finish_profile(self) -> None:
        """Write a profile still under way (fewer rollouts than asked): what the collectors call when they stop."""
        if self.profiler is not None:
            self.profiler.close()

    def set_hooks(self, hooks: bytes) -> None:
        """TorchRL's ``pre_collect_hook()`` / ``post_collect_hook(batch)`` (cloudpickled, either may be None), run
        by :meth:`collect` around each batch: how the process collectors run them in their workers."""
        self.pre_hook, self.post_hook = cloudpickle.loads(hooks)

    def load_policy_weights(self, weights) -> bool:
        """Copy ``weights`` (a TensorDict of the policy's parameters and buffers) into this loop's policy; False
        when the policy is not an ``nn.Module`` (it has no weights)."""
        if policy_module(self.policy) is None:
            return False
        policy_weights_of(self.policy).update_(weights)
        return True

    def policy_state_dict(self) -> dict:
        """The state dict of this loop's policy (``{}`` for a policy that is not an ``nn.Module``)."""
        module = policy_module(self.policy)
        return {} if module is None else module.state_dict()

    def reset_envs(self, **reset_kwargs) -> None:
        """Every env starts a new episode (the next batch begins with a reset; ``reset_kwargs`` go to the env's
        ``reset``)."""
        self.root = self.env.reset(**reset_kwargs)
        self.traj_steps = torch.zeros(self.n_envs, dtype=torch.int64)

    # ----------------------------------------------------------------- one batch
    def collect(self, random: bool = False) -> TensorDictBase:
        """Fill ``self.storage`` with the next ``steps`` steps of every env; returns it (not a copy)."""
        if self.pre_hook is not None:
            self.pre_hook()
        if self.profiler is not None:
            self.profiler.before()
        with self.grad_mode(), set_exploration_type(self.exploration_type):
            if self.buffer_path and (self.env.is_closed or self.env.root_buffer is not self._bound_root_buffer):
                self._rebind()
            elif self.reset_at_each_iter and not self._first:
                self.root = self.env.reset()
                self.traj_steps = torch.zeros(self.n_envs, dtype=torch.int64)
            step = self._buffer_step if self.buffer_path else self._stacked_step if self.stacked else self._generic_step
            # actions drawn from the spec itself need no policy call and no check after the first step
            random = random or isinstance(self.policy, RandomPolicy)
            interruptor = self.interruptor
            self.steps_taken = self.steps
            self._steps = []
            for t in range(self.steps):
                step(t, random)
                if interruptor is not None and interruptor.collection_stopped():
                    self.steps_taken = t + 1
                    break
            if self.stacked:  # [n_envs, T]: an unbatched env's steps were given a batch dim of one
                self.storage = stack_steps(self._steps, -1)
                self._steps = []
        self._first = False
        if self.check_values:
            check_finite(self.storage.get("next"), "the collector", "step()")
        if self.profiler is not None:
            self.profiler.after()
        if self.post_hook is not None:
            self.post_hook(self.storage)
        return self.storage

    def _buffer_step(self, t: int, random: bool) -> None:
        env = self.env
        if random:
            out = self.random_actions.sample()  # a dict: key -> tensor
            for dst in self.policy_outputs_at[t]:
                dst.zero_()
        elif self.direct_inputs is not None:
            out = self.policy.outputs(self.direct_inputs)  # a dict: key -> tensor
        else:
            out = self.policy(self.policy_in.clone(recurse=False))  # the root buffer's leaves, in a new TD
        actions = [out.get(key) for key in self.action_keys]
        if (self.check_actions and not random) or (self._first and t == 0):
            env.write_actions(out, check=self.action_check)  # shape, dtype, values
        else:
            torch._foreach_copy_(self.action_buffers, actions)
        self.recorder.record_root(t)
        if random:
            self.recorder.record_actions(t)
        else:
            torch._foreach_copy_(self.policy_outputs_at[t], [out.get(k) for k in self.policy_keys])
        env.step_buffers()
        self.recorder.record_next(t)
        if self.max_frames_per_traj:
            self._truncate_long_trajectories(t)

    def _acted(self, random: bool) -> TensorDictBase:
        """The root with this step's actions (a TorchRL env's step, outside the lean path)."""
        if random:
            return self.root.update(self.random_actions.sample())
        out = self.policy(self.root)  # a policy may return a new TensorDict (its outputs only), as TorchRL allows
        td = out if out is self.root else self.root.update(out)
        for key, shape in self._action_shapes:
            action = td.get(key, None)
            if action is not None and (shaped := in_spec_shape(action, shape)) is not action:
                td.set(key, shaped)  # (only when it changed: this runs every step)
        return td

    def _generic_step(self, t: int, random: bool) -> None:
        td, self.root = self.env.step_and_maybe_reset(self._acted(random))
        if self._output_checks is not None:
            root_checks, next_checks = self._output_checks
            check_entries(td.get("next"), next_checks, 0, "step()")
            check_entries(self.root, root_checks, 0, "reset()")
        sources = [td.get(key, None) for key in self._copied_keys] if self._leaves_at is not None else None
        if sources is not None and all(source is not None for source in sources):
            torch._foreach_copy_(self._leaves_at[t], sources)  # one copy call for all the leaves (casting as update_)
        else:  # (heterogeneous entries, or an entry this step lacks: by key)
            self.views[t].update_(td.select(*self.storage_keys, strict=False))
        if self.max_frames_per_traj:
            self._truncate_long_trajectories(t)

    def _stacked_step(self, t: int, random: bool) -> None:
        td, self.root = self.env.step_and_maybe_reset(self._acted(random))
        td = td.clone()  # (the env may reuse its tensors)
        self._steps.append(td.unsqueeze(0) if not self.env.batch_size else td)

    def _truncate_long_trajectories(self, t: int) -> None:
        """TorchRL's ``max_frames_per_traj`` (its ``StepCounter``): ``"step_count"`` at the root and under
        ``"next"`` (int64 ``[n_envs, 1]`` per step); a trajectory that reaches the limit is truncated (``done``)
        and its env reset."""
        root_counts, next_counts = self._step_counts
        root_counts[:, t, 0] = self.traj_steps
        counts = self.traj_steps + 1
        next_counts[:, t, 0] = counts
        over = counts >= self.max_frames_per_traj
        ends = ends_of([leaf[:, t].reshape(self.n_envs, -1) for leaf in self._done_leaves])
        self.traj_steps = torch.where(ends | over, 0, counts)
        if not over.any():
            return
        for key in ("done", "truncated"):
            flags = self.storage.get(("next", key), None)
            if flags is not None:  # (envs with nested done flags only: StepCounter truncates them alike)
                flags[:, t][over] = True
        mask = over & ~ends  # (an episode that ended at this step was reset by the env already: once, as TorchRL)
        if not mask.any():
            return
        reset = TensorDict({"_reset": mask.view(*self.env.batch_size, 1)}, batch_size=self.env.batch_size)
        if self.buffer_path:
            self.env.reset(reset)
        else:
            self.root = self.env.reset(self.root.update(reset))


def loop_options(reset_at_each_iter: bool, max_frames_per_traj: int | None, exploration_type,
                 check_actions: bool | str, check_values: bool = False) -> dict:
    """The keyword arguments of :class:`~tdcollect.collectors.loop.BatchLoop` every collector passes on."""
    exploration_type = exploration_type_of(exploration_type)
    action_check(check_actions, COLLECTOR_ACTION_CHECKS)  # (an unknown mode: a clear error, in this process)
    if max_frames_per_traj is not None and max_frames_per_traj <= 0:
        max_frames_per_traj = None  # TorchRL's -1: no limit
    return {"reset_at_each_iter": bool(reset_at_each_iter), "max_frames_per_traj": max_frames_per_traj,
            "exploration_type": exploration_type,
            "check_actions": check_actions,
            "check_values": bool(check_values)}


def exploration_type_of(given):
    """The ``ExplorationType`` a collector's ``exploration_type`` argument names, as TorchRL reads it: the enum, its
    name or value in any case (TorchRL's trainer configs pass ``"RANDOM"``), or ``None`` (the default); anything else
    is a ``ValueError`` here, not at the first batch."""
    from torchrl.envs.utils import ExplorationType

    if given is None:
        return DEFAULT_EXPLORATION_TYPE
    if isinstance(given, ExplorationType):
        return given
    if isinstance(given, str) and given.lower() in {kind.value for kind in ExplorationType}:  # ("random", ...)
        return ExplorationType(given.lower())
    raise ValueError(f"exploration_type must be an ExplorationType or its name "
                     f"({', '.join(e.name for e in ExplorationType)}), got {given!r}.")


def _is_next(key) -> bool:
    return isinstance(key, tuple) and key[0] == "next"


def seed_into_episodes(env: EnvBase, seed: int, static_seed: bool) -> tuple[int | None, dict]:
    """``env.set_seed(seed, static_seed)`` such that a reset with the returned keyword arguments starts the
    episodes the seeds start: ``(the seed after the last env's, reset kwargs)``. One of tdcollect's batched envs
    under any ``TransformedEnv`` (whose ``set_seed`` is its base env's) is seeded through
    ``BatchedEnv.seed_episodes``; a TorchRL env whose seeding is itself a reset (``GymEnv``, stepped as it is) is
    reset with ``seed=seed`` (the seeded reset again); any other env's next reset starts the seeded episodes."""
    base = env
    while isinstance(base, TransformedEnv):
        base = base.base_env
    if isinstance(base, BatchedEnv):
        return base.seed_episodes(seed, static_seed), {}
    out = env.set_seed(seed, static_seed=static_seed)
    return out, {"seed": seed} if seeding_resets(env) else {}


def rngs_untouched():
    """A context in which torch's random draws (the CPU generator's, and every initialized CUDA device's) leave the
    generators as they were."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else [])
