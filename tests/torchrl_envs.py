"""Small TorchRL envs for the drop-in tests (test_torchrl_dropin.py): written here, in TorchRL's own style."""
from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import Categorical, Composite, NonTensor, OneHot, Unbounded
from torchrl.envs import EnvBase


class Nested:
    """An object hanging off an env, for chained forwarding (``env.nested.value``)."""

    value = 42

    def get_value(self) -> int:
        return self.value


class TorchCountingEnv(EnvBase):
    """``observation`` counts the steps since the last reset (float ``[*batch, 1]``); the action (int64, in
    ``[0, 3]``) is added to ``last_action``; an element ends (terminated) after ``max_steps`` steps.

    ``batch_size``: the env's own batch (a batched TorchRL env). ``nested_done``: the done flags live only under
    ``("agents", ...)`` (multi-agent style), none at the root. ``one_hot``: the action is a one-hot ``[4]``.
    ``close_marker``: a path written when ``close()`` runs. ``seed_offset``: added to every observation (so that
    constructors with different kwargs give different data). ``dynamic``: declare a ragged entry (shape -1).
    """

    def __init__(self, max_steps: int = 5, batch_size=(), nested_done: bool = False, one_hot: bool = False,
                 close_marker: str | None = None, seed_offset: float = 0.0, dynamic: bool = False):
        super().__init__(batch_size=torch.Size(batch_size))
        self.max_steps, self.nested_done, self.one_hot = max_steps, nested_done, one_hot
        self.close_marker, self.seed_offset = close_marker, seed_offset
        self.custom_attr = 1
        self._private_count = 7
        self.nested = Nested()
        self.seeds: list = []
        self.threads_at_construction = torch.get_num_threads()
        b = self.batch_size
        self.observation_spec = Composite(observation=Unbounded((*b, 1)), last_action=Unbounded((*b, 1)), shape=b)
        if dynamic:  # a ragged entry, as TorchRL's dynamic specs declare it
            self.observation_spec["history"] = Unbounded((*b, -1))
        action = OneHot(4, shape=(*b, 4)) if one_hot else Categorical(4, shape=(*b, 1))
        self.action_spec = action
        self.reward_spec = Unbounded((*b, 1))
        if nested_done:
            flags = Composite(done=Categorical(2, (*b, 1), dtype=torch.bool),
                              terminated=Categorical(2, (*b, 1), dtype=torch.bool), shape=b)
            self.done_spec = Composite(agents=flags, shape=b)
        self.count = torch.zeros((*b, 1))

    def custom_fun(self) -> int:
        return 0

    @property
    def custom_prop(self) -> int:
        return 2

    def _done_entries(self, done: torch.Tensor) -> dict:
        if self.nested_done:
            return {"agents": {"done": done.clone(), "terminated": done.clone()}}
        return {"done": done.clone(), "terminated": done.clone()}

    def _reset(self, tensordict=None):
        if tensordict is not None and "_reset" in tensordict.keys():
            mask = tensordict["_reset"]
        elif tensordict is not None and ("agents", "_reset") in tensordict.keys(True):
            mask = tensordict["agents", "_reset"]
        else:
            mask = torch.ones_like(self.count, dtype=torch.bool)
        self.count[mask] = 0
        obs = self.count + self.seed_offset
        return TensorDict({"observation": obs.clone(), "last_action": torch.zeros_like(obs),
                           **self._done_entries(self.count >= self.max_steps)}, self.batch_size)

    def _step(self, tensordict):
        action = tensordict["action"]
        value = action.long().argmax(-1, keepdim=True) if self.one_hot else action
        self.count += 1
        done = self.count >= self.max_steps
        return TensorDict({"observation": self.count + self.seed_offset, "last_action": value.float(),
                           "reward": torch.ones_like(self.count), **self._done_entries(done)}, self.batch_size)

    def _set_seed(self, seed):
        self.seeds.append(seed)

    def close(self, *, raise_if_closed: bool = True):
        if self.close_marker:
            Path(self.close_marker).write_text("closed")
        super().close(raise_if_closed=raise_if_closed)


class TextEnv(EnvBase):
    """An unbatched TorchRL env with non-tensor entries: ``"text"`` is the step count as a string (or
    ``prefix + count``); ``"blob"``, when ``blob_bytes`` > 0, a bytes object of that size (larger than a pipe's
    buffer)."""

    def __init__(self, prefix: str = "", blob_bytes: int = 0):
        super().__init__()
        self.prefix, self.blob_bytes = prefix, blob_bytes
        entries = {"observation": Unbounded((1,)), "text": NonTensor(shape=(), example_data="0")}
        if blob_bytes:
            entries["blob"] = NonTensor(shape=(), example_data=b"")
        self.observation_spec = Composite(entries, shape=())
        self.action_spec = Categorical(2, shape=(1,))
        self.reward_spec = Unbounded((1,))
        self.count = 0

    def _entries(self) -> dict:
        entries = {"observation": torch.full((1,), float(self.count)), "text": f"{self.prefix}{self.count}"}
        if self.blob_bytes:
            entries["blob"] = bytes(self.blob_bytes)
        return entries

    def _reset(self, tensordict=None):
        self.count = 0
        return TensorDict({**self._entries(), "done": torch.zeros(1, dtype=torch.bool),
                           "terminated": torch.zeros(1, dtype=torch.bool)}, [])

    def _step(self, tensordict):
        self.count += 1
        done = torch.tensor([self.count >= 3])
        return TensorDict({**self._entries(), "reward": torch.ones(1), "done": done, "terminated": done.clone()}, [])

    def _set_seed(self, seed):
        pass
