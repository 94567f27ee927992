"""TorchRL's ``step_mdp`` replayed from a recording (``RecordedStepMdp`` in ``envs/libs/envbase.py``): at every step
of seeded rollouts, what it returns must be what the env's own ``_step_mdp`` returns (the same keys in the same order
at every level, the very same tensors, new tensordicts, batch sizes and devices), replayed where the layout was
seen, and TorchRL's own call wherever the input differs (another key, a non-tensor entry, new specs)."""
from __future__ import annotations

import functools

import pytest
import torch
from tensordict import NonTensorData, TensorDict
from torchrl.data import Unbounded

from tdcollect.envs import SerialEnv
from tdcollect.envs.libs.envbase import RecordedStepMdp
from tests.helpers import same_layout
from tests.test_next_root import GroupEnv
from tests.torchrl_envs import TorchCountingEnv

pytestmark = pytest.mark.timeout(120)

ENVS = {
    "flat keys": functools.partial(TorchCountingEnv, max_steps=4),
    "nested done": functools.partial(TorchCountingEnv, max_steps=3, nested_done=True),
    "agent group": GroupEnv,
}


class Counted(RecordedStepMdp):
    """Counts TorchRL's own calls."""

    def __init__(self, env):
        super().__init__(env)
        self.torchrl_calls = 0

    def __call__(self, state):
        before = self._layouts[0] if self._layouts else None
        out = super().__call__(state)
        after = self._layouts[0] if self._layouts else None
        self.torchrl_calls += before is not after or not self._layouts
        return out


def steps_of(env, steps: int = 30):
    """States and TorchRL's next states of a seeded rollout of ``env`` (actions from a seeded generator), each
    state with its ``"next"``, as ``step_and_maybe_reset`` builds them."""
    env.set_seed(3)
    generator = torch.Generator().manual_seed(2)
    td = env.reset()
    for _ in range(steps):
        action = env.full_action_spec.rand()
        for key in action.keys(True, True):
            spec = env.full_action_spec[key]
            action[key] = spec.rand() if spec.dtype.is_floating_point else torch.randint(
                0, int(spec.space.n), spec.shape, generator=generator).to(spec.dtype)
        td.update(action)
        td.set("next", env._step(td))
        yield td
        td = env.maybe_reset(env._step_mdp(td))


@pytest.mark.parametrize("name", ENVS)
def test_replays_are_torchrls_step_mdp(name):
    env = ENVS[name]()
    recorded = Counted(env)
    count = 0
    for state in steps_of(env):
        got = recorded(state)
        same_layout(got, env._step_mdp(state), state)
        count += 1
    # replayed from the second layout on: TorchRL's call at most at each first state of an episode and after it
    assert recorded.torchrl_calls < count / 2, (recorded.torchrl_calls, count)


def test_another_layout_goes_through_torchrls_call():
    env = GroupEnv()
    recorded = Counted(env)
    states = list(steps_of(env, steps=4))
    for state in states:
        recorded(state)
    calls = recorded.torchrl_calls
    extra = states[-1].clone(recurse=False)
    extra["agents", "policy_output"] = torch.zeros(2)  # a key the recorded layouts lack, inside the group
    same_layout(recorded(extra), env._step_mdp(extra), extra)
    assert ("agents", "policy_output") in recorded(extra).keys(True, True)
    reordered = TensorDict({key: states[-1][key] for key in reversed(list(states[-1].keys()))}, [])
    same_layout(recorded(reordered), env._step_mdp(reordered), reordered)
    assert recorded.torchrl_calls >= calls + 2


def test_a_non_tensor_entry_is_never_replayed():
    """Layouts recorded with a tensor ``"note"``; a state with the same keys but a non-tensor ``"note"`` (TorchRL's
    step_mdp clones it) goes through TorchRL's call, and so do states that have one from the start."""
    env = functools.partial(TorchCountingEnv, max_steps=4)()
    recorded = RecordedStepMdp(env)
    for index, state in enumerate(steps_of(env, steps=12)):
        text = index >= 6
        state["note"] = NonTensorData("text", batch_size=state.batch_size) if text else torch.zeros(1)
        got = recorded(state)
        expected = env._step_mdp(state)
        assert list(got.keys()) == list(expected.keys())
        if text:
            assert got["note"] == "text" and got.get("note") is not state.get("note")  # (TorchRL clones it)
        else:
            same_layout(got, expected, state)
    fresh = RecordedStepMdp(env)
    for state in steps_of(env, steps=3):
        state["note"] = NonTensorData("text", batch_size=state.batch_size)
        assert fresh(state).get("note") is not state.get("note")


def test_new_specs_bring_new_rules():
    """An ``"extra"`` entry in the state and in ``"next"``: kept from the state while it is no observation; once the
    specs make it one, taken from ``"next"``, with the very same keys as before."""
    env = functools.partial(TorchCountingEnv, max_steps=50)()
    recorded = RecordedStepMdp(env)
    states = steps_of(env, steps=10)

    def with_extra(state):
        state["extra"] = torch.zeros(1)
        state["next", "extra"] = torch.ones(1)
        return state

    for _, state in zip(range(4), states):
        state = with_extra(state)
        assert recorded(state)["extra"] is state["extra"]
    assert recorded._layouts
    spec = env.observation_spec.clone()
    spec["extra"] = Unbounded((1,))
    env.observation_spec = spec  # the specs change: TorchRL's step_mdp now takes "extra" from "next"
    state = with_extra(next(states))
    got = recorded(state)
    same_layout(got, env._step_mdp(state), state)
    assert got["extra"] is state["next", "extra"]


def test_a_serial_env_steps_as_before_with_the_recording_off(monkeypatch):
    """The lean step with the replay, against the same SerialEnv with TorchRL's step_mdp called at every step."""
    def rollout():
        with SerialEnv(2, GroupEnv) as env:
            env.set_seed(1)
            torch.manual_seed(0)  # (the random actions)
            return env.rollout(40, break_when_any_done=False)

    replayed = rollout()
    monkeypatch.setattr(RecordedStepMdp, "__call__", lambda self, state: self.env._step_mdp(state))
    assert (rollout() == replayed).all()


class EchoEnv(TorchCountingEnv):
    """Hands back its input's observation tensor as the next one in its first three steps, new ones after."""

    def _step(self, tensordict):
        out = super()._step(tensordict)
        if int(self.count.sum()) <= 3:
            out["observation"] = tensordict["observation"]
        return out


def test_a_tensor_in_both_inputs_is_never_recorded():
    """Where the env hands back a tensor of its input, the recording cannot tell whether TorchRL took it from the
    state or from ``"next"``: nothing is recorded, and every step is TorchRL's."""
    env = EchoEnv(max_steps=50)
    recorded = RecordedStepMdp(env)
    for state in steps_of(env, steps=12):
        got = recorded(state)
        same_layout(got, env._step_mdp(state), state)
