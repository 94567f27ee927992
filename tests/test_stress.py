"""Stress (marked slow). Chaos: a worker SIGKILLed every 0.5 s for 8 s, with a budget of 50 restarts; kills land
anywhere (mid-step, between steps, in a replacement's start-up exchange, during its first reset), and every step
and every batch must come out full and valid, every kill paid for from the budget. Soaks: many workers for many
steps, every frame checked, without hang or memory growth.

Each test runs twice: a short version in the default run (a quarter of the kills and frames) and the whole one in
the long tier (``-m long``, run by CI); see the ``tier`` fixture. Under spawn the kill tests run in the long tier
only."""
import gc
import random
import threading
import time
import warnings

import numpy as np
import psutil
import pytest
import torch

from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import AsyncParallelEnv, ParallelEnv, SerialEnv
from tdcollect.envs.vector import ParallelVecEnv, ParallelVectorEnv
from tests.conftest import live_children
from tests.helpers import CountingEnv, cartpole

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DURATION_S, PERIOD_S, BUDGET = 8.0, 0.5, 50  # ~16 kills per test in the long tier, ~4 in the short one
#: an episode length no test reaches on any machine (a float32 count stays exact to 2**24 steps): in the kill tests
#: an episode ends only when its worker is replaced, whatever the machine's speed
NEVER = 2**62


class Tier:
    """How much of each test runs: ``share`` of the kills' duration (``duration_s``) and of the soaks' frames."""

    def __init__(self, share: float):
        self.share = share
        self.duration_s = DURATION_S * share

    def skip_short_spawn(self, method: str) -> None:
        """Spawn's variants run whole, in the long tier: their short version would only repeat it there."""
        if method == "spawn" and self.share < 1:
            pytest.skip("spawn: the whole version runs in the long tier")

    def frames(self, whole: int) -> int:
        """This tier's share of a soak's ``whole`` frames (or steps)."""
        return int(whole * self.share)


#: spawn's replacements take seconds each: the spawn variants of the kill tests run in the long tier only
SPAWN_LONG_ONLY = pytest.param("spawn", marks=pytest.mark.long)


@pytest.fixture(params=[pytest.param(0.25, id="short"), pytest.param(1.0, id="long", marks=pytest.mark.long)])
def tier(request) -> Tier:
    """The short version (default run) or the whole test (``-m long``)."""
    return Tier(request.param)


class Killer(threading.Thread):
    """SIGKILLs one random live worker of ``owner`` every ``PERIOD_S`` for ``duration_s`` (or until stopped);
    ``pids``: where to pick (default: ``owner.worker_pids``)."""

    def __init__(self, owner, duration_s: float, pids=None):
        super().__init__(daemon=True)
        self.owner, self.kills, self._stop_event = owner, 0, threading.Event()
        self.duration_s = duration_s
        self.pids = pids or (lambda: self.owner.worker_pids)

    def run(self):
        rng = random.Random(0)
        deadline = time.monotonic() + self.duration_s
        while not self._stop_event.wait(PERIOD_S) and time.monotonic() < deadline:
            pids = self.pids()
            if pids:
                try:
                    pid = rng.choice(pids)
                    # only a process below this one: a worker's id freed and reused in the meantime (e.g. by one
                    # of this process' threads, whose ids share the pid space) is left alone
                    victim = next((p for p in psutil.Process().children(recursive=True) if p.pid == pid), None)
                    if victim is not None:
                        victim.kill()
                        self.kills += 1
                except psutil.NoSuchProcess:
                    pass

    def stop(self):
        self._stop_event.set()
        self.join()

    def enough_kills(self) -> bool:
        """Whether the chaos happened: most of the kills the duration allows."""
        return self.kills >= 0.6 * self.duration_s / PERIOD_S


def _check_step(root, step):
    """CountingEnv: obs = [steps so far, action, seed]. A step either counts on from its root, or (its worker
    was replaced) is the reset observation, marked truncated, with reward 0."""
    count, nxt = root["observation"][:, 0], step["next", "observation"]
    truncated = step["next", "truncated"].squeeze(-1)
    counted_on = (nxt[:, 0] == count + 1) & (nxt[:, 1] == step["action"].float()) & ~truncated
    restarted = (nxt[:, 0] == 0) & truncated & (step["next", "reward"].squeeze(-1) == 0)
    assert (counted_on | restarted).all(), (root["observation"], step["next"].to_dict())
    return int(restarted.sum())


# spawn: a replacement takes seconds to start, so many kills land in a start-up exchange; fork: most land mid-step
@pytest.mark.parametrize("method", ["fork", SPAWN_LONG_ONLY])
def test_parallel_env_survives_a_kill_every_half_second(method, tier, no_leaks):
    tier.skip_short_spawn(method)
    env = ParallelEnv(4, lambda: CountingEnv(episode_len=NEVER), envs_per_worker=2, max_restarts=BUDGET,
                      mp_start_method=method)
    killer = Killer(env, tier.duration_s)
    steps = restarted = 0
    with env, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        td = env.reset()
        killer.start()
        last = False
        while not last:  # one more step after the last kill: every dead worker is noticed and paid for
            last = not killer.is_alive()
            td["action"] = torch.randint(0, 3, (8,))
            root = td.clone()
            step, td = env.step_and_maybe_reset(td)
            restarted += _check_step(root, step)
            steps += 1
        assert killer.enough_kills()
        assert killer.kills - 2 <= sum(env.restarts) <= killer.kills, (env.restarts, killer.kills)
        assert restarted >= 1, "a worker killed mid-step has its envs marked truncated"
    assert steps > 20


def _check_batch(batch) -> None:
    """A full CountingEnv batch: within it every env counts on by one per step, or ended (then the next root is
    a reset)."""
    assert batch.batch_size == (4, 20)
    obs, nxt = batch["observation"], batch["next", "observation"]
    assert torch.isfinite(obs).all() and torch.isfinite(nxt).all()
    done = batch["next", "done"].squeeze(-1)
    assert ((nxt[..., 0] == obs[..., 0] + 1) | done).all()
    assert (obs[:, 1:, 0][~done[:, :-1]] == nxt[:, :-1, 0][~done[:, :-1]]).all()


def _collect_under_kills(collector, killer) -> int:
    """Iterate ``collector`` while ``killer`` runs, checking every batch, until one batch after the last kill;
    the number of batches."""
    batches, last = 0, False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        killer.start()
        for batch in collector:
            _check_batch(batch)
            batches += 1
            if last:
                break
            last = not killer.is_alive()  # one more batch after the last kill
    assert killer.enough_kills(), "the chaos happened"
    return batches


@pytest.mark.parametrize("method", ["fork", SPAWN_LONG_ONLY])
def test_collector_survives_a_kill_every_half_second(method, tier, no_leaks):
    tier.skip_short_spawn(method)
    collector = MultiSyncCollector([lambda: CountingEnv(episode_len=25)] * 4, frames_per_batch=80,
                                   max_restarts=BUDGET, mp_start_method=method)
    killer = Killer(collector, tier.duration_s)
    with collector:
        assert _collect_under_kills(collector, killer) > 2
        assert killer.kills - 2 <= sum(collector.restarts) <= killer.kills, (collector.restarts, killer.kills)


def test_async_env_survives_a_kill_every_half_second(tier, no_leaks):
    """First-finished-first-served stepping: each env counts on from its own last observation with the action
    it was sent, or (its worker was replaced) comes back reset, marked truncated, with reward 0."""
    env = AsyncParallelEnv(4, lambda: CountingEnv(episode_len=NEVER), envs_per_worker=2, batch_workers=2,
                           max_restarts=BUDGET)
    killer = Killer(env, tier.duration_s)
    last: dict[int, tuple] = {}  # env id -> (count it was at, action sent)
    steps = restarted = 0
    with env, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        env.async_reset()
        killer.start()
        done_after_kills = 0
        while done_after_kills < 4:  # a few batches after the last kill: every dead worker is noticed
            done_after_kills += not killer.is_alive()
            td = env.recv()
            nxt, truncated = td["next", "observation"], td["next", "truncated"].squeeze(-1)
            for row, i in enumerate(td["env_ids"].tolist()):
                if i in last and not truncated[row]:
                    count, action = last[i]
                    assert nxt[row, 0] == count + 1 and nxt[row, 1] == action, (i, last[i], nxt[row])
                elif i in last:  # replaced mid-step: the reset state, reward 0
                    assert nxt[row, 0] == 0 and td["next", "reward"][row] == 0 and td["next", "done"][row]
                    restarted += 1
                else:
                    assert nxt[row, 0] == 0
            td["action"] = torch.randint(0, 3, (td.shape[0],))
            for row, i in enumerate(td["env_ids"].tolist()):
                last[i] = (int(td["observation"][row, 0]), int(td["action"][row]))
            env.send(td)
            steps += 1
        env.recv()  # the rest in flight, before close
        assert killer.enough_kills()
        assert killer.kills - 2 <= sum(env.restarts) <= killer.kills, (env.restarts, killer.kills)
        assert restarted >= 1
    assert steps > 20


@pytest.mark.parametrize("face", ["vector", "sb3"])
def test_vector_facades_survive_a_kill_every_half_second(face, tier, no_leaks):
    """gymnasium's (next-step autoreset) and SB3's (same-step) faces: every env counts on by one per step with
    the action it was given, or ends (a replaced worker's envs report truncated) and starts again from 0."""
    fns = [lambda: CountingEnv(episode_len=NEVER)] * 8
    cls = ParallelVectorEnv if face == "vector" else ParallelVecEnv
    env = cls(fns, envs_per_worker=2, max_restarts=BUDGET)
    killer = Killer(env, tier.duration_s)
    steps = ended = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        obs = env.reset()[0] if face == "vector" else env.reset()
        was_done = np.zeros(8, bool)
        killer.start()
        last = False
        try:
            while not last:
                last = not killer.is_alive()
                action = np.random.randint(0, 3, 8)
                if face == "vector":
                    new, reward, terminated, truncated, _ = env.step(action)
                    done = terminated | truncated
                    reset_step = was_done  # next-step autoreset: this step only reset those envs
                    assert (new[reset_step, 0] == 0).all() and (reward[reset_step] == 0).all()
                    go_on = ~reset_step & ~done
                    assert (new[go_on, 0] == obs[go_on, 0] + 1).all() and (new[go_on, 1] == action[go_on]).all()
                    assert (new[done, 0] == 0).all() and truncated[done].all()  # a replaced worker's envs
                    was_done = done
                else:
                    new, reward, done, infos = env.step(action)
                    assert (new[~done, 0] == obs[~done, 0] + 1).all() and (new[~done, 1] == action[~done]).all()
                    assert (new[done, 0] == 0).all()  # same-step autoreset: the reset observation
                    assert all(infos[i]["TimeLimit.truncated"] for i in np.flatnonzero(done))
                ended += int(done.sum())
                obs = new
                steps += 1
            assert killer.enough_kills()
            assert killer.kills - 2 <= sum(env.restarts) <= killer.kills, (env.restarts, killer.kills)
            assert ended >= 1
        finally:
            killer.stop()
            env.close()
    assert steps > 20


def _descendants() -> list[int]:
    """Every process below this one but multiprocessing's helpers: collector workers and their env workers."""
    return [p.pid for p in live_children()]


def _nested_counting():
    return ParallelEnv(2, lambda: CountingEnv(episode_len=25), max_restarts=BUDGET)


def test_nested_parallel_env_in_a_collector_survives_kills_at_both_levels(tier, no_leaks):
    """A MultiSyncCollector whose workers step a ParallelEnv each: kills land on collector workers and on their
    env workers; batches stay full and every step counts on or ends."""
    collector = MultiSyncCollector([_nested_counting] * 2, frames_per_batch=80, max_restarts=BUDGET,
                                   cat_results=0)  # [all envs, T]
    killer = Killer(collector, tier.duration_s, _descendants)
    with collector:
        assert _collect_under_kills(collector, killer) > 2


# ----------------------------------------------------------------- soaks
def resident_mib(pids) -> float:
    """Resident memory of this process plus ``pids`` (MiB)."""
    procs = [psutil.Process()] + [psutil.Process(pid) for pid in pids]
    return sum(p.memory_info().rss for p in procs) / 2**20


def test_16_workers_200k_steps_without_growth(tier, no_leaks):
    with ParallelEnv(16, cartpole, envs_per_worker=4) as env:  # 64 envs on 2 cores
        env.rollout(50, break_when_any_done=False)
        gc.collect()
        start = resident_mib(env.worker_pids)
        steps = 0
        while steps < tier.frames(200_000):
            td = env.rollout(500, break_when_any_done=False)
            steps += td.numel()
        del td
        gc.collect()
        end = resident_mib(env.worker_pids)
    print(f"\nParallelEnv soak: {steps} steps, resident memory {start:.0f} MiB -> {end:.0f} MiB")
    assert end - start < 64, f"resident memory grew from {start:.0f} to {end:.0f} MiB"


def sixteen_cartpoles():
    return SerialEnv(16, cartpole)


def test_collector_1m_frames_without_growth(tier, no_leaks):
    collector = MultiSyncCollector([sixteen_cartpoles] * 2, None, frames_per_batch=4096,
                                   total_frames=tier.frames(1_000_000))
    with collector:
        frames = 0
        for i, batch in enumerate(collector):
            frames += batch.numel()
            if i == 5:
                gc.collect()
                start = resident_mib(collector.worker_pids)
        del batch
        gc.collect()
        end = resident_mib(collector.worker_pids)
    print(f"\nMultiSyncCollector soak: {frames} frames, resident memory {start:.0f} MiB -> {end:.0f} MiB")
    assert frames >= tier.frames(1_000_000)
    assert end - start < 64, f"resident memory grew from {start:.0f} to {end:.0f} MiB"


# ----------------------------------------------------------------- every face: long runs, every frame checked
def _counting():
    return CountingEnv(episode_len=50)


def _check_counts(obs, nxt, action, done) -> None:
    """CountingEnv frames: the next observation counts on by one from the one acted on, with the action taken;
    an ended episode's next frame is its last (count 50)."""
    assert (nxt[:, 0] == obs[:, 0] + 1).all(), (obs[:, 0], nxt[:, 0])
    assert (nxt[:, 1] == action).all()
    assert (nxt[done, 0] == 50).all()


def test_async_env_soak_every_frame_checked(tier, no_leaks):
    with AsyncParallelEnv(8, _counting, envs_per_worker=4, batch_workers=4) as env:
        env.async_reset()
        frames, start = 0, None
        last = {}  # env id -> (count acted on, action)
        for i in range(tier.frames(20_000)):
            td = env.recv()
            ids = td["env_ids"]
            known = torch.tensor([int(j) in last for j in ids.tolist()])
            if known.any():
                before = torch.tensor([last[j] for j in ids.tolist() if j in last], dtype=torch.float32)
                _check_counts(before[:, :1].expand(-1, 3), td["next", "observation"][known], before[:, 1],
                              td["next", "done"][known].squeeze(-1))
            td["action"] = torch.randint(0, 3, (td.shape[0],))
            for j, count, action in zip(ids.tolist(), td["observation"][:, 0].tolist(), td["action"].tolist()):
                last[j] = (count, action)
            env.send(td)
            frames += td.shape[0]
            if i == 500:
                gc.collect()
                start = resident_mib(env.worker_pids)
        env.recv()
        gc.collect()
        end = resident_mib(env.worker_pids)
    print(f"\nAsyncParallelEnv soak: {frames} frames, resident memory {start:.0f} MiB -> {end:.0f} MiB")
    assert end - start < 64, f"resident memory grew from {start:.0f} to {end:.0f} MiB"


@pytest.mark.parametrize("face", ["vector", "sb3"])
def test_vector_facade_soak_every_frame_checked(face, tier, no_leaks):
    import numpy as np

    fns = [_counting] * 16
    env = ParallelVectorEnv(fns, autoreset_mode="SameStep") if face == "vector" else ParallelVecEnv(fns)
    try:
        obs = env.reset()[0] if face == "vector" else env.reset()
        start = None
        for i in range(tier.frames(25_000)):
            action = np.random.randint(0, 3, 16)
            out = env.step(action)
            new = out[0]
            done = (out[2] | out[3]) if face == "vector" else out[2]
            assert (new[~done, 0] == obs[~done, 0] + 1).all() and (new[~done, 1] == action[~done]).all()
            assert (new[done, 0] == 0).all()  # same-step autoreset: the reset observation
            finals = [out[4]["final_obs"][j] if face == "vector" else out[3][j]["terminal_observation"]
                      for j in np.flatnonzero(done)]
            assert all(final[0] == 50 for final in finals)
            obs = new
            if i == 500:
                gc.collect()
                start = resident_mib(env.worker_pids)
        gc.collect()
        end = resident_mib(env.worker_pids)
    finally:
        env.close()
    print(f"\n{type(env).__name__} soak: {16 * tier.frames(25_000)} steps, resident memory {start:.0f} MiB -> "
          f"{end:.0f} MiB")
    assert end - start < 64, f"resident memory grew from {start:.0f} to {end:.0f} MiB"


def _nested():
    return ParallelEnv(2, _counting, envs_per_worker=8)


def test_nested_parallel_env_in_collector_soak_every_frame_checked(tier, no_leaks):
    collector = MultiSyncCollector([_nested] * 2, None, frames_per_batch=3200,
                                   total_frames=tier.frames(1_280_000),
                                   cat_results=0)  # [all envs, T]
    with collector:
        frames = 0
        for i, batch in enumerate(collector):
            obs, nxt = batch["observation"], batch["next", "observation"]
            done = batch["next", "done"].squeeze(-1)
            _check_counts(obs.reshape(-1, 3), nxt.reshape(-1, 3), batch["action"].reshape(-1).float(),
                          done.reshape(-1))
            assert (obs[:, 1:, 0][done[:, :-1]] == 0).all() and (obs[:, 1:, 0][~done[:, :-1]] ==
                                                                  nxt[:, :-1, 0][~done[:, :-1]]).all()
            frames += batch.numel()
            if i == 5:
                gc.collect()
                start = resident_mib(_all_pids())
        del batch
        gc.collect()
        end = resident_mib(_all_pids())
    print(f"\nnested MultiSyncCollector soak: {frames} frames, resident memory {start:.0f} MiB -> {end:.0f} MiB")
    assert frames >= tier.frames(1_280_000)
    assert end - start < 96, f"resident memory grew from {start:.0f} to {end:.0f} MiB"


def _all_pids() -> list[int]:
    from tests.conftest import live_children

    return [p.pid for p in live_children()]
