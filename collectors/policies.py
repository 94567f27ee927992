"""Turning what users pass as a policy into a callable ``TensorDict [n_envs] -> TensorDict`` that sets
``"action"`` (and whatever else it computes, e.g. log-probabilities).

Accepted: a ``TensorDictModule`` / TorchRL actor; a plain ``nn.Module`` mapping the observation tensor to
the action tensor; any callable on a TensorDict; ``None`` (random actions from the env's action spec).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from types import SimpleNamespace

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn
from torchrl.data import StackedComposite


class ActionSampler:
    """Draws every action entry uniformly from a (batched) full action spec, leaf by leaf: ``sample()`` gives
    ``{key: tensor}``. The same draws as ``full_action_spec.rand()``, without building a TensorDict (which costs
    ~200 µs per call, more than a cheap env's step)."""

    def __init__(self, full_action_spec):
        self.spec = full_action_spec
        self.leaves = [(key, full_action_spec[key]) for key in full_action_spec.keys(True, True)]
        if any(isinstance(spec, StackedComposite) for spec in full_action_spec.values(True)):
            self.leaves = None  # heterogeneous entries (one shape per agent): drawn as a whole, a TensorDict

    def sample(self) -> dict | TensorDictBase:
        if self.leaves is None:
            return self.spec.rand()
        return {key: leaf.rand() for key, leaf in self.leaves}


class RandomPolicy:
    """Samples every action entry uniformly from the (batched) full action spec."""

    def __init__(self, full_action_spec):
        self.sampler = ActionSampler(full_action_spec)

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        for key, value in self.sampler.sample().items():
            td.set(key, value)
        return td


class ObservationToAction(nn.Module):
    """Wraps an ``nn.Module`` that maps ``td[in_key]`` to the action: sets ``td["action"]``."""

    def __init__(self, module: nn.Module, in_key="observation", out_key="action"):
        super().__init__()
        self.module = module
        self.in_key = in_key
        self.out_key = out_key

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        return td.set(self.out_key, self.module(td.get(self.in_key)))


class UnwrappedModule:
    """Runs a plain ``TensorDictModule`` by calling its inner module on the input tensors and setting the
    outputs: the same result without the per-call TensorDict machinery."""

    def __init__(self, td_module: TensorDictModule):
        self.td_module = td_module
        self.module = td_module.module
        self.in_keys = list(td_module.in_keys)
        self.out_keys = list(td_module.out_keys)

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        for key, value in self.outputs([td.get(key) for key in self.in_keys]).items():
            td.set(key, value)
        return td

    def outputs(self, inputs: list[torch.Tensor]) -> dict:
        """``{out_key: tensor}`` from the input tensors (in ``in_keys`` order), no TensorDict involved."""
        outputs = self.module(*inputs)
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        return {key: value for key, value in zip(self.out_keys, outputs) if key != "_"}


class OnOneEnv:
    """Calls the policy on the one env of a wrapped unbatched env as TorchRL's collectors do: on a TensorDict
    without batch dim (``[1]`` -> ``[]``), its outputs given the dim back. Policies written for such envs (e.g.
    TorchRL's ``RandomPolicy(spec)``, or a module returning ``spec.rand()``) may ignore the batch shape."""

    def __init__(self, policy: Callable):
        self.policy = policy

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        leaves = dict(td.items())
        if not all(type(value) is torch.Tensor for value in leaves.values()):  # nested or non-tensor entries
            out = self.policy(td[0].clone(recurse=False))
            return td.update(out.unsqueeze(0))
        inputs = {key: value[0] for key, value in leaves.items()}  # views of the one env's row
        out = self.policy(TensorDict(inputs, batch_size=(), device=td.device))
        for key, value in out.items():  # what the policy wrote, given its dim back (its inputs are td's already)
            if inputs.get(key) is not value:
                td.set(key, value.unsqueeze(0))
        return td


def runs_cuda(policy_device, module: nn.Module | None) -> bool:
    """Whether a worker running this policy uses CUDA: its device is a CUDA one, or (no device given) the module
    holds CUDA tensors, which the worker rebuilds where they were."""
    if policy_device is not None:
        return torch.device(policy_device).type == "cuda"
    if module is None:
        return False
    return any(t.is_cuda for t in (*module.parameters(), *module.buffers()))


class OnDevice:
    """Runs ``policy`` on ``device``: inputs go there through a pinned staging copy, outputs come back (on the CPU,
    the TensorDicts the policy sees carry the CPU device, as TorchRL's do for an explicit policy device)."""

    def __init__(self, policy: Callable, device: torch.device):
        self.policy = policy
        self.device = device
        self._staging = None

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        if self.device.type == "cuda":
            if self._staging is None or set(self._staging.keys(True, True)) != set(td.keys(True, True)):
                self._staging = td.clone().pin_memory()
            else:
                self._staging.update_(td)
            moved = self._staging.to(self.device, non_blocking=True)
        else:
            moved = td.to(self.device)
        out = self.policy(moved)
        return td.update(out.to("cpu"))


#: how the error for a plain ``nn.Module`` policy that cannot be wrapped starts (TorchRL's words)
UNWRAPPABLE = "Arguments to policy.forward are incompatible with entries in"


def auto_wrapped(module: nn.Module, observation_spec, action_keys: list) -> Callable:
    """A plain ``nn.Module`` (tensors in, tensors out) made a TensorDict policy, as TorchRL's collectors do: when
    the names of its ``forward`` arguments are observation keys, a ``TensorDictModule`` reading them and writing
    the action (and ``"output1"``, ``"output2"``, ... for the further outputs of a tuple); a one-argument module
    with other names maps ``"observation"`` to the action; a ``forward(tensordict)`` is called on the
    TensorDict."""
    params = inspect.signature(module.forward).parameters
    if set(params) in ({"tensordict"}, {"td"}):
        return module
    required = [name for name, p in params.items() if p.default is inspect.Parameter.empty]
    observations = {key for key in observation_spec.keys() if isinstance(key, str)}
    if required and set(required) <= observations:
        in_keys = [name for name in params if name in observations]
        with torch.no_grad():
            probe = module(**{key: observation_spec[key].zero() for key in in_keys})
        extra = [f"output{i + 1}" for i in range(len(probe) - 1)] if isinstance(probe, tuple) else []
        return TensorDictModule(module, in_keys=in_keys, out_keys=[*action_keys[:1], *extra])
    if len(required) == 1:
        return ObservationToAction(module, "observation", action_keys[0] if action_keys else "action")
    raise TypeError(f"{UNWRAPPABLE} the env's observations: {type(module).__name__}.forward({', '.join(params)}) "
                    f"cannot be wrapped; its arguments must be observation keys ({sorted(observations)}), or one "
                    "tensor (the observation); or pass a TensorDictModule.")


def make_policy(policy, full_action_spec, policy_device=None, observation_spec=None,
                unbatched: bool = False) -> Callable:
    """The callable the collector loop calls once per step (see the module docstring). ``unbatched``: the env
    is an unbatched one wrapped with batch ``[1]``; the policy then runs on ``[]``, as in TorchRL."""
    if policy is None:
        return RandomPolicy(full_action_spec)
    if getattr(policy, "action_spec", False) is None and hasattr(policy, "set_action_spec_from_env"):
        # TorchRL's RandomPolicy() without a spec: the collector gives it the env's (the spec of one env, for an
        # unbatched env, as the policy then sees one env's TensorDict)
        policy.set_action_spec_from_env(SimpleNamespace(full_action_spec=full_action_spec[0] if unbatched
                                                        else full_action_spec))
    if isinstance(policy, nn.Module) and not isinstance(policy, TensorDictModuleBase):
        policy = (ObservationToAction(policy) if observation_spec is None
                  else auto_wrapped(policy, observation_spec, list(full_action_spec.keys(True, True))))
    if (type(policy) is TensorDictModule and list(policy.out_keys) == list(policy.out_keys_source)
            and policy.inplace is True):
        policy = UnwrappedModule(policy)
    elif not callable(policy):
        raise TypeError(
            f"policy must be a TensorDictModule, an nn.Module (observation -> action), a callable on a "
            f"TensorDict or None; got {type(policy).__name__}."
        )
    if unbatched:
        policy = OnOneEnv(policy)
    device = torch.device(policy_device) if policy_device is not None else None
    if device is not None and device.type != "cpu":
        if isinstance(policy_module(policy), nn.Module):
            policy_module(policy).to(device)
        return OnDevice(policy, device)
    if device is not None and not isinstance(policy, UnwrappedModule):  # TorchRL's: its TensorDicts say the CPU
        return OnDevice(policy, device)  # (an UnwrappedModule sees tensors only)
    return policy


def with_exploration_specs(policy, env):
    """``policy``, its exploration modules built without a spec (``AdditiveGaussianModule(spec=None)``: TorchRL's
    TD3 trainer config) given the env's action spec, as TorchRL's collectors give it (its own function)."""
    if isinstance(policy, nn.Module):
        from torchrl.modules import set_exploration_modules_spec_from_env

        set_exploration_modules_spec_from_env(policy, env)
    return policy


def policy_module(policy) -> nn.Module | None:
    """The ``nn.Module`` holding the policy's weights, if any."""
    while isinstance(policy, (OnDevice, OnOneEnv)):
        policy = policy.policy
    if isinstance(policy, UnwrappedModule):
        policy = policy.td_module
    if isinstance(policy, ObservationToAction):
        policy = policy.module
    return policy if isinstance(policy, nn.Module) else None


def one_policy(policy, policy_factory, owner: str):
    """The policy, or the one ``policy_factory()`` builds (TorchRL's argument; not both)."""
    if policy_factory is None:
        return policy
    if policy is not None:
        raise TypeError(f"{owner}: pass policy or policy_factory, not both.")
    if not callable(policy_factory):
        raise TypeError(f"{owner}: policy_factory must be a function returning the policy, got "
                        f"{type(policy_factory).__name__}.")
    return policy_factory()


def calls_at_construction(policy, fake: Callable[[], TensorDictBase], buffers: bool) -> bool:
    """Whether TorchRL's ``Collector`` calls ``policy`` once when it is built, to learn what it writes. With
    ``buffers`` (its storage preallocated from the env's ``fake()`` step), unless the policy's ``spec`` (all of its
    entries given) names every key of its ``out_keys`` that the fake step lacks; without (envs whose entries change
    shape), only a policy without ``out_keys``. No policy is TorchRL's ``RandomPolicy``: no spec, no out_keys."""
    if policy is None:
        return True
    out_keys = getattr(policy, "out_keys", ())
    spec = getattr(policy, "spec", None)
    full_spec = spec is not None and all(value is not None for value in spec.values(True, True))
    if not buffers:
        return not out_keys
    if not full_spec:
        return True
    spec_keys = set(spec.keys(True, True))
    fake_keys = set(fake().keys(True, True))
    named = spec_keys if any(key not in fake_keys for key in spec_keys) else set()
    return any(key not in named for key in out_keys)


def draw_as_torchrl_at_construction(policy, wrapped: Callable, env, root: TensorDictBase, unbatched: bool,
                                    buffers: bool) -> None:
    """The random draws TorchRL's ``Collector`` makes when it is built (:func:`calls_at_construction`: a call of
    the policy on the first reset's output, under the caller's exploration type, outside any collection), made
    here on the caller's generators: the draws that follow (the first actions, exploration noise) are TorchRL's.
    ``policy``: the caller's (None: TorchRL's ``RandomPolicy``, one draw of the action spec); ``wrapped``: what
    this collector calls (the same draws on a TensorDict of batch ``[1]`` for an ``unbatched`` env);
    ``buffers``: the collector's storage is preallocated (see :func:`calls_at_construction`)."""
    if not calls_at_construction(policy, env.fake_tensordict, buffers):
        return
    with torch.no_grad():
        if policy is None:
            spec = env.full_action_spec
            (spec[0] if unbatched else spec).rand()
        else:
            wrapped(root.clone())
