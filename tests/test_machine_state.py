"""Decisions taken from the machine's state leave a seeded run's data alone (the docs' "Nothing from the machine's
state"): each forced each way, the same steps, value for value.

- waiting: the main process and the workers poll for each other (``spin_s``) or block at once (the default on a
  machine with more workers than cores allow to poll);
- output memory: a step's frames handed out in a slot the workers filled, a slot reused once nothing holds it, or
  copied because every slot is still held (a script keeping every step), or every output copied into fresh memory
  (the recycler's threshold above every leaf).

(The layout the machine's cores choose under ``tdcollect run``: ``test_run_command.py``'s threads test and
``test_run_same_numbers.py``.)"""
from __future__ import annotations

import pytest
import torch

from tdcollect.envs import ParallelEnv
from tests.helpers import PixelEpisodesEnv, same

STEPS = 40


def seeded_steps(spin_s: float, min_bytes: int | None, hold: bool) -> list[dict]:
    """``STEPS`` steps of 2 workers x 2 seeded pixel envs with actions from a seeded generator: each step's
    ``"next"`` leaves and next root, copied. ``min_bytes``: the recycler's threshold set before the outputs are bound
    (1: every frame leaf goes to output slots); ``hold``: every step's output is kept until the end."""
    env = ParallelEnv(2, PixelEpisodesEnv, envs_per_worker=2, spin_s=spin_s)
    try:
        if min_bytes is not None:
            env.recycler.min_bytes = min_bytes
            env._bind_copiers()
        env.set_seed(3)
        generator = torch.Generator().manual_seed(5)
        td = env.reset()
        held, out = [], []
        for _ in range(STEPS):
            td["action"] = torch.randint(0, 6, env.action_spec.shape, generator=generator)
            stepped, td = env.step_and_maybe_reset(td)
            out.append({"next": stepped["next"].clone().to_dict(), "root": td.clone().to_dict()})
            if hold:
                held.append((stepped, out[-1]["next"]))
        for stepped, as_returned in held:  # (a slot never refilled while a step held it)
            assert same(stepped["next"].to_dict(), as_returned)
        if min_bytes == 1:  # (the frames came in the slots the workers filled, while some were free)
            assert "pixels" in env._out.keys and env._out.buffers is not None
            assert len(env._out.buffers) < STEPS  # (so holding every step ran out of them)
        return out
    finally:
        env.close()


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    """The steps with the defaults here (blocking, plain outputs), once for every case."""
    return seeded_steps(0.0, None, False)


@pytest.mark.parametrize("spin_s, min_bytes, hold", [
    (0.002, None, False),  # polling, plain outputs
    (0.0, 1, False),  # blocking; frames in slots, each reused once let go
    (0.0, 1, True),  # every step held: the slots run out and the frames are copied
    (0.0, 1 << 62, False),  # nothing recycled: fresh memory for every output
])
def test_waits_and_output_memory_leave_the_data_alone(spin_s, min_bytes, hold, reference, no_leaks):
    assert len({tuple(step["next"]["pixels"].flatten()[:8].tolist()) for step in reference}) > 1  # (frames move)
    assert same(seeded_steps(spin_s, min_bytes, hold), reference)
