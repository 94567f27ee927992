"""gymnasium spaces as TorchRL specs (bounds, dtypes, nested keys, clear errors for what has no spec), the
spec differences named in mismatch errors, the fast value checks against ``spec.is_in``, and unusual dtypes across
the start-up exchange."""
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torchrl.data import Binary, Bounded, Categorical, Composite, MultiCategorical, Unbounded

from tdcollect.envs.engine.specs import spec_differences
from tdcollect.envs.libs.gym import observation_spec_from_space, space_to_spec


def test_box_finite_is_bounded_with_its_bounds():
    spec = space_to_spec(spaces.Box(-1.0, 2.0, (3,), np.float32))
    assert isinstance(spec, Bounded)
    assert spec.shape == (3,) and spec.dtype == torch.float32
    assert torch.equal(spec.space.low, torch.full((3,), -1.0))
    assert torch.equal(spec.space.high, torch.full((3,), 2.0))


def test_box_with_infinite_bound_is_unbounded():
    spec = space_to_spec(spaces.Box(-np.inf, 1.0, (2, 2), np.float64))
    assert isinstance(spec, Unbounded) and spec.shape == (2, 2) and spec.dtype == torch.float64


def test_uint8_image_box():
    spec = space_to_spec(spaces.Box(0, 255, (84, 84, 3), np.uint8))
    assert isinstance(spec, Bounded) and spec.dtype == torch.uint8 and spec.shape == (84, 84, 3)


def test_discrete_multidiscrete_multibinary():
    d = space_to_spec(spaces.Discrete(5, start=2))
    assert isinstance(d, Categorical) and d.shape == () and d.space.n == 5 and d.dtype == torch.int64
    md = space_to_spec(spaces.MultiDiscrete([2, 3]))
    assert isinstance(md, MultiCategorical) and md.shape == (2,)
    mb = space_to_spec(spaces.MultiBinary(4))
    assert isinstance(mb, Binary) and mb.shape == (4,) and mb.dtype == torch.int8


def test_dict_and_tuple_become_nested_keys():
    space = spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Tuple((spaces.Box(0, 1, (1,)), spaces.Discrete(3)))})
    spec = observation_spec_from_space(space)
    assert isinstance(spec, Composite)
    assert set(spec.keys(True, True)) == {"a", ("b", "0"), ("b", "1")}


def test_plain_observation_goes_under_observation_key():
    spec = observation_spec_from_space(spaces.Box(0, 1, (4,)))
    assert list(spec.keys()) == ["observation"]


def test_unsupported_space_is_a_clear_error():
    with pytest.raises(TypeError, match="no TorchRL counterpart"):
        space_to_spec(spaces.Text(5))


def test_spec_differences_lists_the_keys():
    a = Composite(x=Unbounded(shape=(3,)), y=Unbounded(shape=(1,)), shape=())
    b = Composite(x=Unbounded(shape=(5,)), z=Unbounded(shape=(1,)), shape=())
    diffs = spec_differences(a, b)
    assert any(d.startswith("x (") for d in diffs)
    assert "y (missing)" in diffs and "z (unexpected)" in diffs
    assert spec_differences(a, a.clone()) == []


def test_value_checker_agrees_with_is_in():
    """The fast value checks (numpy reductions) say what ``spec.is_in`` says, NaN and bfloat16 included."""
    from torchrl.data import Bounded, Categorical, MultiCategorical

    from tdcollect.envs.inputs import value_checker

    cases = [
        (Categorical(3, shape=(4,)), [torch.tensor([0, 1, 2, 2]), torch.tensor([0, 3, 1, 1]),
                                      torch.tensor([-1, 0, 0, 0])]),
        (Bounded(-1.0, 2.0, shape=(2, 2)), [torch.tensor([[0.0, 2.0], [-1.0, 1.5]]),
                                            torch.tensor([[0.0, 2.5], [0.0, 0.0]]),
                                            torch.tensor([[float("nan"), 0.0], [0.0, 0.0]])]),
        (Bounded(-1.0, 1.0, shape=(2,), dtype=torch.bfloat16), [torch.zeros(2, dtype=torch.bfloat16),
                                                                 torch.full((2,), 3.0, dtype=torch.bfloat16)]),
        (MultiCategorical([2, 3], shape=(2,)), [torch.tensor([1, 2]), torch.tensor([2, 0])]),
        # more than _FEW integer actions: checked by a numpy reduction instead of Python's min / max
        (Categorical(3, shape=(100,)), [torch.arange(100) % 3, torch.arange(100) % 4, -(torch.arange(100) % 2)]),
        (Categorical(3, shape=(2, 1), dtype=torch.int32), [torch.tensor([[2], [0]], dtype=torch.int32),
                                                           torch.tensor([[2], [-5]], dtype=torch.int32)]),
        (Bounded(0, 5, shape=(3,), dtype=torch.int64), [torch.tensor([0, 5, 3]), torch.tensor([0, 6, 3])]),
    ]
    # Bounded(...) builds a BoundedContinuous / BoundedDiscrete: both take the numpy path (spec.is_in costs
    # ~190 us per batched step, more than a MuJoCo env's step)
    assert value_checker(cases[1][0]).__name__ == "check_bounded" == value_checker(cases[-1][0]).__name__
    for spec, values in cases:
        check = value_checker(spec)
        verdicts = [check(v) for v in values]
        assert verdicts == [bool(spec.is_in(v)) for v in values], (spec, verdicts)
        assert verdicts[0] and not all(verdicts)


class WideIntegerEnv(gym.Env):
    """An observation space holding a uint16 tensor in its spec (MultiDiscrete of dtype uint16)."""

    observation_space = spaces.MultiDiscrete([7, 9], dtype=np.uint16)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([1, 2], np.uint16), {}

    def step(self, action):
        return np.array([6, 8], np.uint16), 0.0, False, False, {}


def test_wide_unsigned_specs_cross_the_start_up_handshake(no_leaks):
    """The workers' specs travel by value for every dtype (plain pickle cannot read uint16 tensors back)."""
    from tdcollect.envs import ParallelEnv

    with ParallelEnv(2, WideIntegerEnv) as env:
        assert env.reset()["observation"].tolist() == [[1, 2], [1, 2]]
        out = env.rollout(2)
        assert out["next", "observation"][:, -1].tolist() == [[6, 8], [6, 8]]


def test_buffer_zeros_are_torchrls_zero_without_the_non_tensor_entries():
    """``shared.zeros`` (the buffers' allocation) gives what TorchRL's ``Composite.zero()`` gives, key by key (dtype,
    shape, value), each nested TensorDict of its Composite's shape, or of its ``data_cls`` (a tensorclass, as
    TorchRL's ``EnvWithTensorClass``); NonTensor entries have no buffer."""
    from tensordict import tensorclass
    from torchrl.data import NonTensor, OneHot

    from tdcollect.envs.engine.shared import non_tensor_keys, zeros

    @tensorclass
    class Labelled:
        value: torch.Tensor
        label: str

    spec = Composite(
        a=Unbounded((3, 2)),
        b=Composite(c=Categorical(4, (3, 5), dtype=torch.int64), d=OneHot(3, (3, 3)), shape=(3,)),
        e=NonTensor(shape=(3,)),
        f=Composite(g=Bounded(0, 1, (3, 4, 2), dtype=torch.float64), shape=(3, 4)),
        h=Composite(value=Unbounded((3,)), label=NonTensor(shape=(3,)), shape=(3,), data_cls=Labelled),
        shape=(3,),
    )
    torchrls = spec.zero().exclude(*non_tensor_keys(spec))
    ours = zeros(spec)
    assert sorted(ours.keys(True, True), key=str) == sorted(torchrls.keys(True, True), key=str)
    for key in torchrls.keys(True, True):
        assert ours[key].dtype == torchrls[key].dtype, key
        assert torch.equal(ours[key], torchrls[key]), key
    assert ours.batch_size == (3,) and ours["b"].batch_size == (3,) and ours["f"].batch_size == (3, 4)
    assert "e" not in ours.keys()
    assert type(ours["h"]) is type(torchrls["h"]) is Labelled
    assert torch.equal(ours["h"].value, torchrls["h"].value) and ours["h"].label is None
    # with leading dims (the buffers of 2 workers' envs): TorchRL's expand, then zero
    expanded = spec.expand(2, 3).zero().exclude(*non_tensor_keys(spec))
    ours = zeros(spec, (2,))
    assert sorted(ours.keys(True, True), key=str) == sorted(expanded.keys(True, True), key=str)
    for key in expanded.keys(True, True):
        assert ours[key].dtype == expanded[key].dtype, key
        assert ours[key].shape == expanded[key].shape, key
        assert torch.equal(ours[key], expanded[key]), key
    assert ours.batch_size == (2, 3) and ours["b"].batch_size == (2, 3) and ours["f"].batch_size == (2, 3, 4)
    assert type(ours["h"]) is Labelled and ours["h"].batch_size == (2, 3)
