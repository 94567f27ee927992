"""Multi-player dm_env envs (per-player spec sequences, as MeltingPot's) without MeltingPot: the agent-group layout,
values through ParallelEnv, a dict action per player, a None reward on FIRST, and players that disagree."""
import numpy as np
import pytest
import torch
from torchrl.envs.utils import check_env_specs

from tdcollect.envs import EnvWorkerError, ParallelEnv, SerialEnv

dm_env = pytest.importorskip("dm_env")
from dm_env import specs as dm  # noqa: E402

from tdcollect.envs.libs.dm_env import is_player_list, layout_of  # noqa: E402

pytestmark = pytest.mark.timeout(60)


class Players(dm_env.Environment):
    """``players`` players; each sees its own counter ``"COUNT"`` (float64 scalar) and the shared ``"WORLD.GRID"``
    (uint8 [2, 3] holding the step number); its reward is ``player * step``. The episode ends (discount 0) after
    ``length`` steps. ``act_dict``: each player acts with ``{"move": 0..2, "turn": -1..1}``; else one int 0..3.
    ``counts``: the players' observations (the action they took, summed)."""

    def __init__(self, players=3, length=4, act_dict=False, odd_player=False):
        self.players, self.length, self.act_dict, self.odd_player = players, length, act_dict, odd_player
        self.t, self.counts = 0, np.zeros(players)

    def observation_spec(self):
        specs = [{"COUNT": dm.Array((), np.float64), "WORLD.GRID": dm.Array((2, 3), np.uint8)}
                 for _ in range(self.players)]
        if self.odd_player:
            specs[-1] = {"COUNT": dm.Array((2,), np.float64), "WORLD.GRID": dm.Array((2, 3), np.uint8)}
        return specs

    def action_spec(self):
        if self.act_dict:
            one = {"move": dm.DiscreteArray(3), "turn": dm.BoundedArray((), np.int32, -1, 1)}
        else:
            one = dm.DiscreteArray(4)
        return tuple(one for _ in range(self.players))

    def reward_spec(self):
        return [dm.Array((), np.float64, name="REWARD") for _ in range(self.players)]

    def _observation(self):
        grid = np.full((2, 3), self.t, np.uint8)
        return [{"COUNT": np.float64(c), "WORLD.GRID": grid} for c in self.counts]

    def reset(self):
        self.t, self.counts = 0, np.zeros(self.players)
        return dm_env.restart(self._observation())  # reward None, as dm_env's restart gives it

    def step(self, action):
        assert isinstance(action, list) and len(action) == self.players
        self.t += 1
        for p, a in enumerate(action):
            self.counts[p] += (a["move"] + 10 * a["turn"]) if self.act_dict else a
        rewards = [np.float64(p * self.t) for p in range(self.players)]
        if self.t >= self.length:
            return dm_env.termination(rewards, self._observation())
        return dm_env.transition(rewards, self._observation())


def test_layout_is_an_agent_group():
    env = Players(3)
    assert is_player_list(env)
    layout = layout_of(env)
    obs = layout.observation
    assert obs["agents", "observation", "COUNT"].shape == (3, 1)
    assert obs["agents", "observation", "COUNT"].dtype == torch.float64
    assert obs["GRID"].shape == (2, 3) and "WORLD.GRID" not in obs.keys()
    assert layout.action["agents", "action"].shape == (3,) and layout.action["agents", "action"].space.n == 4
    assert layout.reward["agents", "reward"].shape == (3, 1)


def test_values_through_parallel_env(no_leaks):
    env = ParallelEnv(2, lambda: Players(3, length=4))
    try:
        check_env_specs(env)
        td = env.reset()
        assert torch.equal(td["agents", "observation", "COUNT"], torch.zeros(2, 3, 1, dtype=torch.float64))
        total = torch.zeros(2, 3, 1, dtype=torch.float64)
        for t in range(1, 5):
            action = torch.tensor([[1, 2, 3], [3, 0, 1]])
            td["agents", "action"] = action
            out, td = env.step_and_maybe_reset(td)
            total += action.unsqueeze(-1)
            nxt = out["next"]
            assert torch.equal(nxt["agents", "observation", "COUNT"], total)
            assert torch.equal(nxt["GRID"], torch.full((2, 2, 3), t, dtype=torch.uint8))
            assert torch.equal(nxt["agents", "reward"][0, :, 0], torch.tensor([0.0, t, 2.0 * t], dtype=torch.float64))
            assert nxt["done"].all().item() == (t == 4) and nxt["terminated"].all().item() == (t == 4)
            if t < 4:  # the root to act on next is the observation just returned
                assert torch.equal(td["agents", "observation", "COUNT"], total)
                assert torch.equal(td["GRID"], nxt["GRID"])
        # auto-reset: the next root observation is the new episode's
        assert torch.equal(td["agents", "observation", "COUNT"], torch.zeros(2, 3, 1, dtype=torch.float64))
    finally:
        env.close()


def test_dict_action_per_player_keeps_its_offsets():
    env = SerialEnv(1, lambda: Players(2, act_dict=True))
    try:
        assert env.full_action_spec["agents", "action", "turn"].space.n == 3
        td = env.reset()
        td["agents", "action", "move"] = torch.tensor([[2, 0]])
        td["agents", "action", "turn"] = torch.tensor([[0, 2]])  # -1 and +1 for the engine
        out, _ = env.step_and_maybe_reset(td)
        assert out["next", "agents", "observation", "COUNT"].flatten().tolist() == [2 - 10, 0 + 10]
    finally:
        env.close()


def test_players_that_disagree_are_refused(no_leaks):
    with pytest.raises(ValueError, match="players disagree on the spec of 'COUNT'"):
        layout_of(Players(3, odd_player=True))
    with pytest.raises(EnvWorkerError, match="players disagree"):
        ParallelEnv(2, lambda: Players(3, odd_player=True))


class BadPlayer(Players):
    """:class:`Players` whose last player's ``"COUNT"`` becomes ``value`` at step 2."""

    def __init__(self, value):
        super().__init__(3, length=4)
        self.value = value

    def _observation(self):
        observation = super()._observation()
        if self.t == 2:
            observation[-1]["COUNT"] = self.value
        return observation


@pytest.mark.parametrize("value, says", [
    (np.zeros(2), r"shape \(2,\)"),
    (None, "None, where a number is expected"),
    ("many", "not an array of numbers|dtype <U4"),
], ids=["shape", "none", "text"])
def test_a_bad_value_of_one_player_names_the_key(value, says):
    """A player's value of another shape, None or text: the step fails with the key named, whichever player it is
    (the players' values are checked and written together)."""
    env = SerialEnv(1, lambda: BadPlayer(value))
    try:
        td = env.reset()
        td["agents", "action"] = torch.tensor([[1, 2, 3]])
        env.step_and_maybe_reset(td)
        with pytest.raises(ValueError, match=says) as raised:
            env.step_and_maybe_reset(td)
        assert "COUNT" in str(raised.value)
    finally:
        env.close()
