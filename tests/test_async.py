"""Asynchronous stepping: AsyncParallelEnv (first-finished-first-served stepping, its data, its errors and its
clean-up), and ParallelEnv.begin / finish (one command begun, finished later: the facades' ``*_async``)."""
import functools
import multiprocessing
import threading
import time

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tdcollect.envs import AsyncParallelEnv, EnvWorkerError, ParallelEnv, WorkerDiedError
from tdcollect.envs.engine.group import seed_chain
from tests.helpers import CountingEnv, FaultyEnv, GatedEnv, SlowEnv, SuicidalEnv, cartpole, wait_for_file

pytestmark = pytest.mark.timeout(60)


def send_actions(env, td, action):
    td["action"] = torch.full((td.shape[0],), action)
    env.send(td)


def test_batches_are_whole_workers_with_their_own_data(no_leaks):
    with AsyncParallelEnv(3, functools.partial(CountingEnv, episode_len=4), batch_workers=2,
                          envs_per_worker=2) as env:
        env.async_reset()
        steps = torch.zeros(6, dtype=torch.long)  # steps taken by each env since its episode began
        for i in range(30):
            td = env.recv()
            ids = td["env_ids"]
            assert td.batch_size == (4,) and ids.shape == (4,)
            workers = set((ids // 2).tolist())
            assert len(workers) == 2 and torch.equal(ids[::2] + 1, ids[1::2])
            assert torch.equal(td["observation"][:, 0], steps[ids].float())  # each env's own counter
            assert set(env.in_flight) | workers == {0, 1, 2}
            action = i % 3
            send_actions(env, td, action)
            steps[ids] = (steps[ids] + 1) % 4
        td = env.recv()
        # each env's last step used the action sent to it: the observation records it, the reward is it
        assert torch.equal(td["next", "observation"][:, 1], td["next", "reward"].squeeze(-1))


def test_reset_batches_report_the_reset_state(no_leaks):
    with AsyncParallelEnv(2, CountingEnv, batch_workers=2) as env:
        env.set_seed(5)
        env.async_reset()
        td = env.recv()
        assert torch.equal(td["observation"], td["next", "observation"])
        seeds = dict(zip(td["env_ids"].tolist(), td["observation"][:, 2].tolist()))
        # seeded as TorchRL seeds batched envs: env 0 with 5, env 1 with the next seed of the chain
        assert seeds == {i: float(np.float32(seed)) for i, seed in enumerate(seed_chain(5, 2))}
        assert not td["next", "done"].any() and (td["next", "reward"] == 0).all()


def test_fast_workers_are_served_more_often(no_leaks):
    """With one slow worker and batch_workers=1, the fast one comes back many times per slow step."""
    factories = [functools.partial(SlowEnv, delay=0.2), CountingEnv]
    with AsyncParallelEnv(2, factories, batch_workers=1) as env:
        env.async_reset()
        served = []
        for _ in range(12):
            td = env.recv()
            served.append(int(td["env_ids"][0]))
            send_actions(env, td, 1)
        assert served.count(1) >= 8, served


def test_episode_ends_auto_reset(no_leaks):
    with AsyncParallelEnv(2, functools.partial(CountingEnv, episode_len=2), batch_workers=1) as env:
        env.async_reset()
        ended = 0
        for _ in range(12):
            td = env.recv()
            done = td["next", "done"].squeeze(-1)
            ended += int(done.sum())
            assert (td["observation"][done, 0] == 0).all()  # the reset observation where an episode ended
            send_actions(env, td, 1)
        assert ended > 0


def test_misuse_is_refused_with_a_clear_error(no_leaks):
    with AsyncParallelEnv(2, cartpole, batch_workers=1, envs_per_worker=2, check_actions="raise") as env:
        with pytest.raises(RuntimeError, match="call async_reset"):
            env.recv()
        env.async_reset()
        with pytest.raises(RuntimeError, match="stepping asynchronously"):
            env.rollout(3)
        with pytest.raises(RuntimeError, match="stepping asynchronously"):
            env.async_reset()
        td = env.recv()
        w = int(td["env_ids"][0]) // 2
        with pytest.raises(ValueError, match="whole workers"):
            env.send(td[:1].set("action", torch.zeros(1, dtype=torch.long)))
        with pytest.raises(ValueError, match=r"expects shape \(2,\) \(2 envs"):
            env.send(td.set("action", torch.zeros(2, 1, dtype=torch.long)))
        with pytest.raises(ValueError, match="outside its spec"):
            env.send(td.set("action", torch.full((2,), 7)))
        other = 1 - w
        with pytest.raises(ValueError, match=rf"worker\(s\) \[{other}\]"):
            env.send(td.clone().set("env_ids", torch.tensor([2 * other, 2 * other + 1])))
        send_actions(env, td, 0)
        with pytest.raises(ValueError, match="not waiting for actions"):
            send_actions(env, td, 0)
        env.recv()
        env.recv()
        assert env.reset()["observation"].shape == (4, 4)  # nothing in flight: the synchronous API works
    with pytest.raises(ValueError, match="batch_workers"):
        AsyncParallelEnv(2, cartpole, batch_workers=3)


def test_exception_in_an_async_step_surfaces_in_recv(no_leaks):
    factories = [CountingEnv, functools.partial(FaultyEnv, "step", at_step=2)]
    with AsyncParallelEnv(2, factories, batch_workers=2) as env:
        env.async_reset()
        send_actions(env, env.recv(), 1)
        send_actions(env, env.recv(), 1)
        with pytest.raises(EnvWorkerError, match="worker 1 raised ValueError during step: boom in step 2"):
            env.recv()
        assert env.in_flight == []  # both finished; the batch is dropped and the env can start again
        env.async_reset()
        assert env.recv()["observation"].shape == (2, 3)


def test_dead_worker_in_flight_closes_the_env(no_leaks):
    """Worker 1 dies while worker 0 keeps answering every recv(): the death still surfaces, within a second."""
    with pytest.raises(WorkerDiedError, match="worker 1"):
        with AsyncParallelEnv(2, [CountingEnv, SuicidalEnv], batch_workers=1) as env:
            env.async_reset()
            end = time.monotonic() + 5
            while time.monotonic() < end:
                send_actions(env, env.recv(), 1)
    assert time.monotonic() < end - 3
    assert env.is_closed


def test_close_with_workers_in_flight_leaves_nothing(no_leaks):
    env = AsyncParallelEnv(2, functools.partial(SlowEnv, delay=0.3), batch_workers=1)
    env.async_reset()
    send_actions(env, env.recv(), 1)
    env.close()
    assert env.is_closed and env.worker_pids == []


# ----------------------------------------------------------------- ParallelEnv.begin / finish
def test_a_begun_step_goes_on_past_a_timeout_and_finishes_as_a_blocking_step(tmp_path, no_leaks):
    first, second = tmp_path / "0", tmp_path / "1"
    first.mkdir(), second.mkdir()
    # worker 1's first step and worker 0's second one wait for their gates
    fns = [functools.partial(GatedEnv, str(first), at_step=2), functools.partial(GatedEnv, str(second), at_step=1)]
    with ParallelEnv(2, fns) as env:
        env.reset()
        threads = threading.active_count()
        env.write_actions(TensorDict(action=torch.tensor([1, 2])))
        env.begin("step")
        wait_for_file(str(second / "entered"))
        with pytest.raises(multiprocessing.TimeoutError, match="goes on"):
            env.finish(timeout=0.2)  # (worker 0 is done by now or soon: its part is kept for the next finish)
        with pytest.raises(RuntimeError, match="not finished"):
            env.begin("reset")
        assert threading.active_count() == threads  # no thread runs it: the workers do
        open(second / "open", "w").close()
        assert env.finish(timeout=30) is None
        assert env.next_buffer["observation"][:, :2].tolist() == [[1, 1], [1, 2]]  # (steps, action) per env
        env.write_actions(TensorDict(action=torch.tensor([0, 1])))
        env.begin("step")
        wait_for_file(str(first / "entered"))
        with pytest.raises(multiprocessing.TimeoutError):  # worker 0 is not done: nothing of the last wait is left
            env.finish(timeout=0.2)
        open(first / "open", "w").close()
        env.finish(timeout=30)
        assert env.next_buffer["observation"][:, :2].tolist() == [[2, 0], [2, 1]]
        env.step_buffers()  # a blocking step after them
        assert env.next_buffer["observation"][:, :2].tolist() == [[3, 0], [3, 1]]


def test_a_begun_reset_and_call_finish_as_the_blocking_ones(no_leaks):
    with ParallelEnv(2, functools.partial(CountingEnv, episode_len=1000), envs_per_worker=2) as env:
        env.reset()
        env.write_actions(TensorDict(action=torch.tensor([1, 1, 1, 1])))
        env.step_buffers()
        env.begin("reset", np.array([True, False, False, True]))
        assert env.finish() is None
        assert env.root_buffer["observation"][:, 0].tolist() == [0, 1, 1, 0]
        env.begin("call", call=(("count",), "get", (), None))
        assert env.finish() == [0, 1, 1, 0]


def test_begin_and_finish_refuse_what_they_cannot_do(no_leaks):
    with ParallelEnv(1, CountingEnv) as env:
        env.reset()
        with pytest.raises(RuntimeError, match="no command begun"):
            env.finish()
        with pytest.raises(ValueError, match="'step', 'reset' or 'call'"):
            env.begin("stpe")
        env.begin("call", call=(("nothing_here",), "get", (), None))
        with pytest.raises(EnvWorkerError, match="nothing_here"):
            env.finish()
        env.begin("call", call=(("count",), "get", (), None))  # (the failed call is over)
        assert env.finish() == [0]


def test_a_worker_killed_in_a_begun_step_is_a_worker_died_error(no_leaks):
    with ParallelEnv(2, [CountingEnv, functools.partial(SuicidalEnv, at_step=1)]) as env:
        env.reset()
        env.write_actions(TensorDict(action=torch.tensor([1, 1])))
        env.begin("step")
        with pytest.raises(WorkerDiedError):
            env.finish(timeout=30)
        assert env.is_closed


def test_a_worker_killed_in_a_begun_step_is_replaced_within_max_restarts(no_leaks):
    with ParallelEnv(2, [CountingEnv, functools.partial(SuicidalEnv, at_step=1)], max_restarts=1) as env:
        env.reset()
        env.write_actions(TensorDict(action=torch.tensor([1, 1])))
        env.begin("step")
        with pytest.warns(RuntimeWarning, match="restarting worker 1"):
            assert env.finish(timeout=30) is None
        assert env.restarts == [0, 1]
        assert env.next_buffer["truncated"].squeeze(-1).tolist() == [False, True]  # its step: restarted
        assert env.next_buffer["observation"][0, :2].tolist() == [1, 1]


def test_begin_is_refused_on_a_view_and_while_an_async_env_has_workers_in_flight(no_leaks):
    with ParallelEnv(2, CountingEnv) as env:
        env.reset()
        with pytest.raises(NotImplementedError, match="not on a view"):
            env[0].begin("step")
        with pytest.raises(NotImplementedError, match="not on a view"):
            env[1:].finish()
    with AsyncParallelEnv(2, CountingEnv, batch_workers=1) as env:
        env.async_reset()
        with pytest.raises(RuntimeError, match="stepping asynchronously"):
            env.begin("reset")
        env.recv()
