"""close() on every face: it frees the shared memory at once (nothing of it stays mapped while the object lives
on), and a close() from another thread (or a signal handler) while a step waits is the face's clear "closed"
error: gymnasium's ClosedEnvironmentError for ParallelVectorEnv, a RuntimeError saying "closed" elsewhere."""
import functools
import gc
import threading

import numpy as np
import pytest
from gymnasium.error import ClosedEnvironmentError

from tests.faces import FACES, build, run
from tests.helpers import SlowEnv

pytestmark = pytest.mark.timeout(60)


def shared_mappings() -> set:
    """The shared-memory segments mapped into this process."""
    with open("/proc/self/maps") as maps:
        return {line.split()[5] for line in maps if len(line.split()) > 5 and line.split()[5].startswith("/dev/shm/")}


@pytest.mark.parametrize("face", [f for f in FACES if f != "serial"])
def test_close_unmaps_every_shared_segment(face, no_leaks):
    before = shared_mappings()
    owner = build(face, functools.partial(SlowEnv, 0.0))
    assert shared_mappings() - before, "the open face maps its buffers"
    run_one_step(face, owner)
    owner.shutdown() if face == "multisync" else owner.close()
    gc.collect()  # garbage of earlier tests too; what counts is that the live, closed object holds nothing
    assert not shared_mappings() - before, f"{face}: still mapped after close: {shared_mappings() - before}"
    del owner


def run_one_step(face, owner) -> None:
    if face in ("parallel",):
        owner.rollout(2)
    elif face == "async":
        owner.async_reset()
        owner.recv()
    elif face == "multisync":
        next(iter(owner))
    else:
        owner.reset()
        owner.step(np.zeros(owner.num_envs, np.int64))


@pytest.mark.parametrize("face", [f for f in FACES if f != "serial"])
def test_close_from_another_thread_while_a_step_waits_is_the_closed_error(face, no_leaks):
    owner = build(face, functools.partial(SlowEnv, 0.3))
    close = owner.shutdown if face == "multisync" else owner.close
    if face in ("vector", "sb3", "parallel"):
        owner.reset()  # started: close() lands while a step waits, not during start-up
    elif face == "async":  # both workers stepping slowly when close() comes
        owner.async_reset()
        for _ in range(2):
            owner.send(owner.recv().update({"action": owner.full_action_spec[:1].rand()["action"]}))
    closer = threading.Timer(0.1, close)
    closer.start()
    expected = ClosedEnvironmentError if face == "vector" else RuntimeError
    with pytest.raises(expected, match="closed|shut down") as info:
        if face == "parallel":
            owner.rollout(20)
        elif face == "async":
            owner.recv()
        elif face == "multisync":
            next(iter(owner))
        else:
            for _ in range(20):
                owner.step(np.zeros(owner.num_envs, np.int64))
    closer.join()
    assert not isinstance(info.value, (AttributeError, TypeError))
    close()  # idempotent


def test_run_helper_closes_on_success(no_leaks):
    run("parallel", functools.partial(SlowEnv, 0.0))
