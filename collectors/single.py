"""Collector: one batched env and a policy in this process (the central-inference path with a ParallelEnv:
one batched policy forward per step, on a GPU if asked)."""
from __future__ import annotations

from tensordict import TensorDictBase
from torchrl.envs.utils import ExplorationType

from .base import CollectorBase, check_env_device, loop_options
from .env_setup import make_batched_env
from .loop import DEFAULT_EXPLORATION_TYPE, BatchLoop
from .policies import make_policy
from .weights import policy_weights_of


class Collector(CollectorBase):
    """Yields TensorDicts ``[n_envs, T]`` with ``n_envs * T == frames_per_batch`` (TorchRL keys, time last,
    ``("collector", "traj_ids")``); consecutive batches continue the same episodes.

    Args:
        create_env_fn: a batched env (``ParallelEnv``, ``SerialEnv``, any TorchRL env with one batch dim), a
            gymnasium or unbatched TorchRL env, or a function returning one of these.
        policy: a ``TensorDictModule`` / TorchRL actor, an ``nn.Module`` (observation -> action), a callable
            on a TensorDict, or ``None`` (random actions).
        frames_per_batch: frames per yielded batch (a multiple of the number of envs).
        total_frames: frames to collect in all (-1: endless).
        device: default for ``policy_device`` and ``storing_device``; ``env_device`` must be the CPU.
        policy_device: where the policy runs (inputs go there through pinned memory, actions come back).
        storing_device: where yielded batches live.
        split_trajs, reset_at_each_iter, init_random_frames, max_frames_per_traj: as in TorchRL.
        exploration_type: the interaction type the policy runs under, as in TorchRL (default
            ``ExplorationType.RANDOM``: a ``ProbabilisticActor`` samples its actions).
        check_actions: check every step's actions against the action spec (shape, dtype, bounds, NaN/inf)
            before they reach the envs (default True); False checks the first step only.
        check_values: opt-in (default False): a batch whose observations or rewards hold NaN or an infinity is a
            ``ValueError`` naming the env and the key (shapes, ``None`` and values that do not fit the buffers'
            dtypes are refused always).
        progress_bar: show a tqdm bar with frames/s.
        return_same_td: as in TorchRL, opt-in: yield the same TensorDict every time, its values overwritten by the
            next batch (no copy at all). By default every batch is the caller's to keep: it is never written again
            (its memory is reused only once nothing holds it any more).
    After each batch, ``episode_stats`` holds ``returns`` and ``lengths`` of the episodes that ended in it.
    """

    def __init__(self, create_env_fn, policy=None, frames_per_batch: int = 1000, total_frames: int = -1, *,
                 device=None, env_device=None, policy_device=None, storing_device=None,
                 split_trajs: bool = False, reset_at_each_iter: bool = False, init_random_frames: int = 0,
                 max_frames_per_traj: int | None = None, progress_bar: bool = False,
                 exploration_type: ExplorationType = DEFAULT_EXPLORATION_TYPE, check_actions: bool = True,
                 check_values: bool = False,
                 return_same_td: bool = False):
        super().__init__(frames_per_batch, total_frames, split_trajs=split_trajs,
                         init_random_frames=init_random_frames,
                         storing_device=storing_device or device, progress_bar=progress_bar,
                         return_same_td=return_same_td)
        check_env_device(env_device, "Collector")
        self.env, self._owns_env = make_batched_env(create_env_fn, "Collector")
        try:
            steps = self.steps_per_batch(frames_per_batch, self.env.batch_size.numel(), "Collector")
            self.policy = make_policy(policy, self.env.full_action_spec, policy_device or device)
            self._loop = BatchLoop(self.env, self.policy, steps, **loop_options(
                reset_at_each_iter, max_frames_per_traj, exploration_type, check_actions, check_values))
        except BaseException:
            self._shutdown()
            raise

    def _collect(self, random: bool) -> TensorDictBase:
        batch = self._loop.collect(random)
        return batch if self.return_same_td else self._recycler.clone(batch)

    def set_seed(self, seed: int) -> None:
        """Env i gets the i-th seed of TorchRL's chain (``seed``, ``seed_generator(seed)``, ...; episodes restart);
        the torch RNG is seeded with ``seed``."""
        self._loop.set_seed(seed)
        self._restart_trajectories()

    def update_policy_weights_(self, policy_weights=None) -> None:
        """The policy runs in this process, so it always acts with its current weights; with
        ``policy_weights`` (a TensorDict), those are copied into it first."""
        if policy_weights is not None:
            policy_weights_of(self.policy).update_(policy_weights_of(policy_weights))

    def _shutdown(self) -> None:
        if self._owns_env and not self.env.is_closed:
            self.env.close()

