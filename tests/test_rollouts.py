"""ParallelEnv rollouts with random actions, on both of their paths: recorded by the workers (``ROLL``, see
``envs/worker_rollout.py``; the default) and step by step (this process copies each step out of the buffers: where
the workers cannot record, e.g. into the caller's own ``out=`` storage). The data must be exactly a SerialEnv's, no
step may be taken beyond a rollout that stops at a done, and failures (a worker replaced mid-rollout, a worker
dying, an interrupted rollout) must leave the env as a step-by-step rollout would. A rollout the workers recorded
is never written again while anything holds it."""
import functools

import pytest
import torch
from torchrl.envs.utils import step_mdp

from tdcollect.envs import ParallelEnv, SerialEnv, WorkerDiedError
from tdcollect.envs.engine.worker_rollout import KEEP

from .helpers import CountingEnv, CrashOnceEnv, FrameCountingEnv, SlowEnv, cartpole, compare_when_told

pytestmark = pytest.mark.timeout(120)
PATHS = ["workers", "stepped"]


def _on_path(env, path: str):
    """``env`` with its rollouts on ``path``: "stepped" is the path taken where the workers cannot record."""
    if path == "stepped":
        env.worker_rollouts.storage = lambda steps: None
    return env


def _rollouts(env, seed: int, lengths, break_when_any_done: bool):
    """Consecutive rollouts, each continuing from the last one's final state."""
    env.set_seed(seed)
    torch.manual_seed(seed)
    td, outs = env.reset(), []
    for n in lengths:
        out = env.rollout(n, break_when_any_done=break_when_any_done, auto_reset=False, tensordict=td)
        outs.append(out)
        td = step_mdp(out[..., -1])
        # the buffers hold the rollout's last step (its root: the next observation, where the env did not end)
        assert (env.next_buffer == out.get("next")[..., -1]).all()
        going = ~out.get(("next", "done"))[..., -1, 0]
        assert (env.root_buffer.get("observation")[going] == td.get("observation")[going]).all()
    return outs


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("make", [FrameCountingEnv, cartpole])
@pytest.mark.parametrize("break_when_any_done", [False, True])
def test_rollouts_equal_step_by_step_rollouts(path, make, break_when_any_done, no_leaks):
    lengths = [30, 9, 30]
    with _on_path(ParallelEnv(2, make, envs_per_worker=3), path) as env:
        ours = _rollouts(env, 5, lengths, break_when_any_done)
        assert (len(env.worker_rollouts.kept) > 0) == (path == "workers")
    with SerialEnv(6, make) as serial:
        theirs = _rollouts(serial, 5, lengths, break_when_any_done)
    for a, b in zip(ours, theirs):
        assert a.batch_size == b.batch_size
        assert (a == b).all()
    if break_when_any_done:  # each rollout stopped at its first done, and the next went on from there
        assert all(bool(out.get(("next", "done"))[:, -1].any()) for out in ours[:1])


def test_pipeline_is_deprecated_and_without_effect(no_leaks):
    with pytest.warns(FutureWarning, match=r"pipeline=\.\.\.\) has no effect"):
        env = ParallelEnv(2, cartpole, pipeline=False)
    with env:
        assert env.rollout(5).batch_size == (2, 5)
        assert env.worker_rollouts.kept  # recorded by the workers all the same


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_worker_replaced_mid_rollout(path, how, tmp_path, no_leaks):
    marker = str(tmp_path / "crashed")
    factories = [functools.partial(CountingEnv, episode_len=100), functools.partial(CrashOnceEnv, marker, how, 4)]
    with pytest.warns(RuntimeWarning, match="restarting worker 1"):
        with _on_path(ParallelEnv(2, factories, max_restarts=1), path) as env:
            env.set_seed(0)
            out = env.rollout(10, break_when_any_done=False)
            assert env.restarts == [0, 1]
            steps = out.get("observation")[:, :, 0]
            assert steps[0].tolist() == list(range(10))  # the other worker's env is untouched
            # the replaced env: counts to the crash, then a fresh episode marked truncated at the failed step
            assert steps[1, :3].tolist() == [0, 1, 2]
            assert bool(out.get(("next", "truncated"))[1, 3]) and out.get(("next", "observation"))[1, 3, 0] == 0
            assert steps[1, 4:].tolist() == list(range(6))
            again = env.rollout(5, break_when_any_done=False)  # the new worker got the storage too
            assert again.batch_size == (2, 5)
            assert again.get("observation")[:, :, 0].tolist() == [list(range(5))] * 2


@pytest.mark.parametrize("path", PATHS)
def test_a_worker_dying_mid_rollout_closes_the_env(path, no_leaks):
    factories = [functools.partial(CountingEnv, episode_len=100), functools.partial(CrashOnceEnv, None, "kill", 4)]
    env = _on_path(ParallelEnv(2, factories), path)
    try:
        with pytest.raises(WorkerDiedError):
            env.rollout(10, break_when_any_done=False)
        assert env.is_closed
    finally:
        env.close()


def test_an_error_in_this_process_leaves_no_step_under_way(monkeypatch, no_leaks):
    with _on_path(ParallelEnv(2, FrameCountingEnv), "stepped") as env:
        env.set_seed(0)
        env.rollout(4, break_when_any_done=False)
        from tdcollect.envs.engine.recording import StepRecorder

        calls = {"n": 0}
        real = StepRecorder.record_next

        def failing(self, t):
            calls["n"] += 1
            if calls["n"] == 3:
                raise MemoryError("no room for the copy")
            return real(self, t)

        monkeypatch.setattr(StepRecorder, "record_next", failing)
        with pytest.raises(MemoryError):
            env.rollout(10, break_when_any_done=False)
        monkeypatch.undo()
        out = env.rollout(6, break_when_any_done=False)  # the workers were not left in the middle of a step
        assert out.batch_size == (2, 6) and not env.is_closed


def test_a_rollout_held_is_never_written_again_and_one_let_go_is_reused(no_leaks):
    with ParallelEnv(2, FrameCountingEnv, envs_per_worker=2) as env:
        env.reset()
        held = env.rollout(6, break_when_any_done=False)
        assert not held.get("observation").is_shared()  # sent to another process, it is copied on the way
        copy = held.clone()
        for _ in range(2 * KEEP):
            env.rollout(6, break_when_any_done=False)
            view = env.rollout(6, break_when_any_done=False)[:, 2:]  # a view holds its rollout too
        assert (held == copy).all()
        del view
        kept = [storage.key for storage in env.worker_rollouts.kept]
        env.rollout(6, break_when_any_done=False)
        assert env.worker_rollouts._current.key in kept  # memory let go is filled again, no new memory
        assert len(env.worker_rollouts.kept) <= KEEP


def test_a_rollout_longer_than_the_timeout_runs_in_spans(no_leaks):
    """Each span of ``ROLL`` stays within a quarter of the timeout; the whole rollout may take longer."""
    with ParallelEnv(2, functools.partial(SlowEnv, 0.02), timeout=1.0) as env:
        env.reset()
        out = env.rollout(80, break_when_any_done=False)  # 1.6 s in each worker
        assert out.get(("next", "observation"))[:, :, 0].tolist() == [list(range(1, 81))] * 2
        assert not env.is_closed


def test_a_rollout_without_a_timeout_runs_in_one_span(no_leaks):
    with ParallelEnv(2, cartpole, timeout=float("inf")) as env:
        for _ in range(2):  # (the second from the first one's pace)
            assert env.rollout(20, break_when_any_done=False).batch_size == (2, 20)



def test_a_rollout_held_by_a_forked_process_is_never_refilled(no_leaks):
    ctx = torch.multiprocessing.get_context("fork")
    go, answer = ctx.Event(), ctx.SimpleQueue()
    with ParallelEnv(2, FrameCountingEnv, envs_per_worker=2) as env:
        env.reset()
        frames = env.rollout(5, break_when_any_done=False).get("observation")
        child = ctx.Process(target=compare_when_told, args=(frames, frames.clone(), go, answer))
        child.start()
        del frames  # only the forked process holds the rollout now
        for _ in range(2 * KEEP):
            env.rollout(5, break_when_any_done=False)
        go.set()
        assert answer.get() is True, "the forked process saw its rollout change"
        child.join(30)


def test_past_max_live_storages_rollouts_go_step_by_step(monkeypatch, no_leaks):
    """Each storage holds file descriptors: a caller holding many rollouts gets the later ones step by step."""
    from tdcollect.envs.engine import worker_rollout

    monkeypatch.setattr(worker_rollout, "MAX_LIVE", worker_rollout.live_storages() + 3)
    with ParallelEnv(2, FrameCountingEnv) as env, SerialEnv(2, FrameCountingEnv) as serial:
        ours = _rollouts(env, 3, [4] * 6, False)
        theirs = _rollouts(serial, 3, [4] * 6, False)
        assert worker_rollout.live_storages() <= worker_rollout.MAX_LIVE
        assert all((a == b).all() for a, b in zip(ours, theirs))
        assert not any(out.get("observation").is_shared() for out in ours)


@pytest.mark.parametrize("break_when_any_done", [False, True])
def test_a_rollout_says_it_is_on_the_cpu_as_torchrls(break_when_any_done, no_leaks):
    """The workers' recorded rollout and the step-by-step one carry ``device=cpu``, as a ``SerialEnv``'s and
    TorchRL's rollouts of a CPU env do (a GPU check found ``None``)."""
    with ParallelEnv(2, CountingEnv, envs_per_worker=2) as env:
        assert env.rollout(5, break_when_any_done=break_when_any_done).device == torch.device("cpu")
