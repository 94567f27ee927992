"""The TorchRL family's lean step (``envs/libs/envbase.py``: ``TorchRLStepper._step_lean``): an env whose class keeps
``EnvBase``'s step is stepped without the work that changes nothing on complete outputs. Its data must be what the
env's own ``step_and_maybe_reset`` gives, and so TorchRL's ``SerialEnv``'s, for outputs as complete as the specs and
for outputs ``EnvBase`` completes (a reward of another shape, a missing done flag), flat and nested done flags; an env
that redefines the step, or sits under a transform, goes through its own ``step_and_maybe_reset``."""
from __future__ import annotations

import functools

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase, StepCounter, TransformedEnv
from torchrl.envs import SerialEnv as TorchRLSerialEnv

from tdcollect.envs import SerialEnv
from tests.helpers import same
from tests.torchrl_envs import TorchCountingEnv

STEPS = 23


class LooseOutputsEnv(EnvBase):
    """Declares ``reward`` ``[1]`` and ``done``/``terminated`` ``[1]``, but its ``_step`` returns the reward as a
    scalar and only ``done`` (``EnvBase.step`` reshapes the reward and copies ``done`` into ``terminated``); ends
    after a number of steps drawn at reset from its seeded generator."""

    def __init__(self):
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((2,)))
        self.action_spec = Categorical(3, shape=(1,))
        self.reward_spec = Unbounded((1,))
        self.generator = torch.Generator()
        self.left = 0

    def _reset(self, tensordict=None):
        self.left = int(torch.randint(2, 6, (), generator=self.generator))
        return TensorDict({"observation": torch.rand(2, generator=self.generator),
                           "done": torch.zeros(1, dtype=torch.bool), "terminated": torch.zeros(1, dtype=torch.bool)})

    def _step(self, tensordict):
        self.left -= 1
        action = tensordict["action"].float()
        return TensorDict({"observation": torch.rand(2, generator=self.generator) + action,
                           "reward": (action * 2).sum(),
                           "done": torch.tensor([self.left <= 0])})

    def _set_seed(self, seed):
        self.generator.manual_seed(seed)


class CountedStepEnv(TorchCountingEnv):
    """A :class:`TorchCountingEnv` whose class redefines ``_step_and_maybe_reset`` (it counts its calls)."""

    calls = 0

    def _step_and_maybe_reset(self, tensordict):
        type(self).calls += 1
        return super()._step_and_maybe_reset(tensordict)


ENVS = {
    "complete": functools.partial(TorchCountingEnv, max_steps=4),
    "nested done": functools.partial(TorchCountingEnv, max_steps=3, nested_done=True),
    "loose outputs": LooseOutputsEnv,
    "redefined step": functools.partial(CountedStepEnv, max_steps=4),
    "transformed": lambda: TransformedEnv(TorchCountingEnv(max_steps=6), StepCounter(max_steps=4)),
}


def rollout(env) -> list:
    """``STEPS`` steps of ``env`` (seeded, actions from a seeded generator) through ``step_and_maybe_reset``: each
    step's tensordict and next root, as dicts."""
    env.set_seed(7)
    generator = torch.Generator().manual_seed(3)
    td = env.reset()
    out = []
    for _ in range(STEPS):
        td["action"] = torch.randint(0, 3, env.action_spec.shape, generator=generator)
        stepped, td = env.step_and_maybe_reset(td)
        out.append((stepped.clone().to_dict(), td.clone().to_dict()))
    return out


def roads_and_rollout(make, lean: bool | None = None, root_from_outputs: bool = True) -> tuple[list, list]:
    """Our ``SerialEnv`` of 3 envs of ``make``: whether each takes the lean step, and :func:`rollout`; ``lean=False``
    sends every env through its own ``step_and_maybe_reset``; ``root_from_outputs=False`` has the lean step read the
    next root's entries from ``step_mdp``'s root instead of the step's outputs."""
    env = SerialEnv(3, make)
    try:
        for stepper in env._group.steppers:
            if lean is False:
                stepper._lean = False
            if not root_from_outputs:
                stepper._root_in_next = None
        return [stepper._lean for stepper in env._group.steppers], rollout(env)
    finally:
        env.close()


@pytest.mark.parametrize("name", list(ENVS))
def test_the_lean_step_gives_the_envs_own_step_and_maybe_reset_data(name):
    roads, got = roads_and_rollout(ENVS[name])
    _, expected = roads_and_rollout(ENVS[name], lean=False)
    assert roads == [name in ("complete", "nested done", "loose outputs")] * 3
    assert same(got, expected)
    assert same(roads_and_rollout(ENVS[name], root_from_outputs=False)[1], expected)
    flags = [stepped["next"]["agents"] if name == "nested done" else stepped["next"] for stepped, _ in got]
    assert any(step["done"].any() for step in flags)  # (episodes ended: resets were taken)
    if name == "loose outputs":  # (EnvBase completed the outputs: a reward [1], "terminated" from "done")
        assert all(stepped["next"]["reward"].shape == (3, 1) for stepped, _ in got)
        assert same([stepped["next"]["terminated"] for stepped, _ in got],
                    [stepped["next"]["done"] for stepped, _ in got])


@pytest.mark.parametrize("name", [name for name in ENVS if name != "loose outputs"])
def test_the_lean_step_gives_torchrls_serial_env_data(name):
    """(TorchRL's SerialEnv leaves an entry an env's ``_step`` does not return as the buffer held it, where the env
    alone completes it: ``loose outputs`` is compared with the envs' own steps only, above.)"""
    torchrl_env = TorchRLSerialEnv(3, ENVS[name])
    try:
        expected = rollout(torchrl_env)
    finally:
        torchrl_env.close()
    assert same(roads_and_rollout(ENVS[name])[1], expected)


def test_an_env_that_redefines_its_step_is_stepped_through_it():
    CountedStepEnv.calls = 0
    with SerialEnv(2, ENVS["redefined step"]) as env:
        env.reset()
        for _ in range(5):
            env.step_and_maybe_reset(env.rand_action())
    assert CountedStepEnv.calls == 10


@pytest.mark.parametrize("type_checks", [False, True])
def test_step_proc_data_runs_only_where_it_can_change_something(monkeypatch, type_checks):
    """Complete outputs and no type checks: EnvBase's output processing is skipped (it would change nothing); type
    checks on, or outputs it completes (``loose outputs``): it runs at every step."""
    calls = []
    original = EnvBase._step_proc_data

    def counted(self, next_tensordict):
        calls.append(type(self).__name__)
        return original(self, next_tensordict)

    monkeypatch.setattr(EnvBase, "_step_proc_data", counted)

    def checked(make):
        env = make()
        env.run_type_checks = type_checks
        return env

    for make in (ENVS["complete"], LooseOutputsEnv):
        with SerialEnv(1, functools.partial(checked, make)) as env:
            env.reset()
            for _ in range(4):
                env.step_and_maybe_reset(env.rand_action())
    assert calls.count("LooseOutputsEnv") == 4
    assert calls.count("TorchCountingEnv") == (4 if type_checks else 0)
