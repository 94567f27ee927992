"""close() from another thread at a random moment of a random mix of calls, on every face: the call in flight
finishes or raises the face's one "closed" error (a ``RuntimeError`` saying "closed" or "shut down"; gymnasium's
``ClosedEnvironmentError`` on ``ParallelVectorEnv``), never an error from our internals (an ``AttributeError`` on a
dropped connection, a bad file descriptor), never a hang; nothing is left behind.

``ROUNDS`` rounds per face in the default run; the long tier (``-m long``) runs ``SLOW_ROUNDS``."""
from __future__ import annotations

import functools
import random
import threading

import numpy as np
import pytest
import torch
from gymnasium.error import ClosedEnvironmentError

from tests.faces import FACES, build
from tests.helpers import CountingEnv

ROUNDS = 12
SLOW_ROUNDS = 200
#: the longest a round waits before it closes (its calls take about as long, so closes land anywhere among them)
CLOSE_WITHIN_S = 0.06


def one_call(face: str, owner, rng: random.Random) -> None:
    """One call of a random kind that the face offers (stepping, resetting, a rollout, seeding, a batch...)."""
    kind = rng.randrange(5)
    if face in ("serial", "parallel"):
        if kind == 0:
            owner.rollout(rng.randrange(1, 8), break_when_any_done=False)
        elif kind == 1:
            owner.rand_step(owner.reset())
        elif kind == 2:
            owner.set_seed(rng.randrange(100))
        elif kind == 3:
            td = owner.reset()
            owner.step_and_maybe_reset(td.update(owner.full_action_spec.rand()))
        else:
            owner.reset()
    elif face == "async":
        if not owner.in_flight:
            owner.async_reset()
        for _ in range(kind + 1):
            td = owner.recv()
            owner.send(td.update(owner.full_action_spec[: td.shape[0]].rand()))
    elif face == "multisync":
        if kind == 0:
            owner.update_policy_weights_()
        for i, _ in enumerate(owner):
            if i >= kind:
                break
    else:
        if kind in (0, 1):
            if face == "vector":
                owner.reset(seed=rng.randrange(100))
            else:
                owner.seed(rng.randrange(100))
                owner.reset()
        for _ in range(kind + 1):
            owner.step(np.array([owner.action_space.sample()[0] if face == "vector" else 0] * owner.num_envs))


def closed_error(face: str) -> type:
    return ClosedEnvironmentError if face == "vector" else RuntimeError


def one_round(face: str, seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    kwargs = {"envs_per_worker": 2} if face == "parallel" else {}
    owner = build(face, functools.partial(CountingEnv, 4), **kwargs)
    close = owner.shutdown if face == "multisync" else owner.close
    closer = threading.Timer(rng.uniform(0.0, CLOSE_WITHIN_S), close)
    closer.start()
    try:
        for _ in range(200):
            one_call(face, owner, rng)
            if not closer.is_alive():
                break
    except Exception as err:  # noqa: BLE001 - the one error allowed is checked below
        closer.join()
        if not isinstance(err, closed_error(face)) or not any(word in str(err) for word in ("closed", "shut down")):
            raise AssertionError(f"{face}, round seed {seed}: close() from another thread ended a call with "
                                 f"{type(err).__name__}: {err}") from err
    finally:
        closer.join()
        close()  # idempotent; and a ParallelEnv that a later call started again is closed too


@pytest.mark.timeout(240)
@pytest.mark.parametrize("face", FACES)
def test_close_from_another_thread_at_any_moment_is_the_closed_error(face, no_leaks):
    for seed in range(ROUNDS):
        one_round(face, seed)


@pytest.mark.long
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("face", FACES)
def test_close_race_many_rounds(face, no_leaks):
    for seed in range(SLOW_ROUNDS):
        one_round(face, 1000 + seed)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collector", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_shutdown_right_after_the_workers_answered_is_the_shut_down_error(collector, no_leaks):
    """The narrowest window of the race above, made certain: ``shutdown()`` from another thread lands after the
    workers delivered their batches and before the collector read their storages (which shutdown drops)."""
    from tdcollect import collectors

    owner = getattr(collectors, collector)([functools.partial(CountingEnv, 4)] * 2, None, frames_per_batch=4)
    try:
        finished = owner._pool.run if collector == "MultiSyncCollector" else owner._next_finished

        def then_shut_down(*args, **kwargs):
            answer = finished(*args, **kwargs)
            closer = threading.Thread(target=owner.shutdown)
            closer.start()
            closer.join()
            return answer

        if collector == "MultiSyncCollector":
            owner._pool.run = then_shut_down
        else:
            owner._next_finished = then_shut_down
        with pytest.raises(RuntimeError, match="shut down"):
            next(iter(owner))
    finally:
        owner.shutdown()
