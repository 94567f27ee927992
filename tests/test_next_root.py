"""The next root ``step_and_maybe_reset`` returns for nested keys (``envs/inputs.root_merger``, built level by level):
the same keys in the same order, the same tensors, new nested tensordicts, as TensorDict's ``exclude``, ``clone`` and
``update`` build it, and as TorchRL's ``SerialEnv`` returns it for a multi-agent env (actions, observations and
rewards in an agent group, done flags at the root and in the group)."""
from __future__ import annotations

import functools

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase
from torchrl.envs import ParallelEnv as TorchRLParallelEnv

from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.inputs import root_merger
from tests.helpers import same_layout

pytestmark = pytest.mark.timeout(120)

ROOT_KEYS = [("agents", "observation"), ("agents", "done"), "done"]
DROPPED = ["next", "_step", ("agents", "reward")]


def generic(tensordict: TensorDict, root: TensorDict) -> TensorDict:
    """The next root as TensorDict's generic path builds it (the merger must give the same)."""
    out = tensordict.exclude(*DROPPED).clone(recurse=False)
    return out.update(root.select(*ROOT_KEYS))


def batch(n: int = 3) -> TensorDict:
    return TensorDict({"agents": TensorDict({"observation": torch.zeros(n, 2, 4), "done": torch.zeros(n, 2, 1).bool(),
                                             "reward": torch.ones(n, 2, 1)}, [n, 2]),
                       "done": torch.zeros(n, 1).bool()}, [n])


def step_input(n: int = 3) -> TensorDict:
    """A step's input: last root (a reward in the group too, which the next root must leave out), actions in the
    group, a policy's outputs, the step's ``next``."""
    td = batch(n)
    td["agents", "action"] = torch.ones(n, 2, dtype=torch.long)
    td["agents", "policy"] = TensorDict({"logits": torch.rand(n, 2, 3)}, [n, 2])
    td["hidden"] = torch.rand(n, 5)
    td["next"] = batch(n)
    return td


@pytest.mark.parametrize("case", ["whole input", "no group in the input", "root from the step", "device set"])
def test_the_merger_builds_what_tensordicts_generic_path_builds(case):
    merge = root_merger(ROOT_KEYS, DROPPED)
    td = step_input()
    root = batch()
    if case == "no group in the input":
        del td["agents"]
    elif case == "root from the step":
        root = td["next"]  # the step's tensors, its reward in the group left out
    elif case == "device set":
        td = td.to("cpu")
    got = merge(td, root)
    same_layout(got, generic(td, root), td)


def test_the_merger_declines_what_it_does_not_build():
    merge = root_merger(ROOT_KEYS, DROPPED)
    td = step_input()
    named = td.clone()
    named.refine_names("envs")
    assert merge(named, batch()) is None  # dim names: TensorDict's path keeps them
    stacked = td.clone()
    stacked["agents", "policy"] = LazyStackedTensorDict.lazy_stack([TensorDict({"a": torch.zeros(3)}, [3]),
                                                                    TensorDict({"a": torch.ones(3)}, [3])], dim=1)
    assert type(stacked["agents", "policy"]) is LazyStackedTensorDict
    assert merge(stacked, batch()) is None
    flat_group = step_input()
    flat_group["agents"] = torch.zeros(3, 2)  # a tensor where the root has a group
    assert merge(flat_group, batch()) is None
    assert root_merger(["agents"], ["next", ("agents", "reward")]) is None  # overlapping keys: no merger at all


class GroupEnv(EnvBase):
    """Two agents in an ``"agents"`` group: observation, action, reward and done flags there, and done flags at the
    root; an episode lasts a number of steps drawn at reset from the seeded generator."""

    def __init__(self):
        super().__init__()
        group = (2,)
        self.observation_spec = Composite(agents=Composite(observation=Unbounded((*group, 3)), shape=group))
        self.action_spec = Composite(agents=Composite(action=Categorical(4, shape=group), shape=group))
        self.reward_spec = Composite(agents=Composite(reward=Unbounded((*group, 1)), shape=group))
        flags = Categorical(2, shape=(*group, 1), dtype=torch.bool)
        self.done_spec = Composite(agents=Composite(done=flags, terminated=flags.clone(), shape=group),
                                   done=Categorical(2, shape=(1,), dtype=torch.bool),
                                   terminated=Categorical(2, shape=(1,), dtype=torch.bool))
        self.generator = torch.Generator()
        self.left = 0

    def _outputs(self, done: bool) -> dict:
        flags = torch.full((2, 1), done)
        return {"agents": {"observation": torch.rand(2, 3, generator=self.generator), "done": flags,
                           "terminated": flags.clone()},
                "done": torch.tensor([done]), "terminated": torch.tensor([done])}

    def _reset(self, tensordict=None):
        self.left = int(torch.randint(2, 5, (), generator=self.generator))
        return TensorDict(self._outputs(False), [])

    def _step(self, tensordict):
        self.left -= 1
        out = TensorDict(self._outputs(self.left <= 0), [])
        out["agents", "reward"] = tensordict["agents", "action"].float().unsqueeze(-1)
        return out

    def _set_seed(self, seed):
        self.generator.manual_seed(seed)


def next_roots(env, steps: int = 12) -> tuple[list, int]:
    """Each step's next root (seeded env, actions from a seeded generator, a policy's entry beside them); an entry
    set in a next root's group must not appear in the step returned with it (new nested tensordicts). Also the
    number of episodes that ended."""
    env.set_seed(5)
    generator = torch.Generator().manual_seed(1)
    td = env.reset()
    out = []
    ended = 0
    for _ in range(steps):
        td["agents", "action"] = torch.randint(0, 4, (env.batch_size[0], 2), generator=generator)
        td["agents", "policy_output"] = torch.rand(env.batch_size[0], 2, generator=generator)
        stepped, td = env.step_and_maybe_reset(td)
        ended += int(stepped["next", "done"].sum())
        out.append(td.clone())
        td["agents", "marker"] = torch.zeros(env.batch_size[0], 2)  # (a new entry of the root: the step has none)
        assert "marker" not in stepped["agents"].keys() and "marker" not in stepped["next", "agents"].keys()
        del td["agents", "marker"]
    return out, ended


@pytest.mark.parametrize("ours", [SerialEnv, ParallelEnv])
def test_nested_next_roots_are_torchrls(ours):
    """A multi-agent env's next roots, step after step (episodes end): the generic path's keys in the same order
    and values; TorchRL's ``ParallelEnv``'s values at its keys. Its keys are the specs' (observations, done flags,
    actions); ours also keep the input's other entries in the group, as an env's own ``step_mdp`` keeps them.
    (TorchRL's two batched envs differ here: its ``SerialEnv`` keeps them too, but zeroes them and the actions in
    the group of an env it reset; with top-level keys all keep them.)"""
    torchrl_env = TorchRLParallelEnv(3, GroupEnv, mp_start_method="fork")
    try:
        expected, _ = next_roots(torchrl_env)
    finally:
        torchrl_env.close()
    with ours(3, GroupEnv) as env:
        assert env._merge_root is not None
        got, ended = next_roots(env)
        env._merge_root = None
        generic_roots, _ = next_roots(env)
    assert ended >= 3  # (episodes ended in between)
    for step, (mine, theirs, plain) in enumerate(zip(got, expected, generic_roots)):
        assert list(mine.keys(True, True)) == list(plain.keys(True, True)), step
        assert set(mine.keys(True, True)) - set(theirs.keys(True, True)) == {("agents", "policy_output")}, step
        for key in theirs.keys(True, True):
            assert torch.equal(mine[key], theirs[key]) and torch.equal(mine[key], plain[key]), (step, key)


def test_a_policy_entry_in_the_group_survives_an_episode_end():
    """The input's entries in the group (here a policy's) reach the next root whether an env ended or not."""
    with SerialEnv(2, functools.partial(GroupEnv)) as env:
        roots, ended = next_roots(env, steps=8)
    assert ended and all(("agents", "policy_output") in root.keys(True, True) for root in roots)
