"""Transforms run in the workers (``worker_transform``, ``move_transforms_to_workers``): the same data as the same
transforms in this process, over TorchRL's PPO-Atari transform list (``sota-implementations/ppo/utils_atari.py``)
on a small pixel env whose envs end at different steps; and clear errors for what cannot run there."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torchrl.envs import (
    CatFrames,
    Compose,
    DoubleToFloat,
    GrayScale,
    GymWrapper,
    NoopResetEnv,
    RenameTransform,
    Resize,
    RewardSum,
    SignTransform,
    StepCounter,
    ToTensorImage,
    TransformedEnv,
    VecNorm,
)
from torchrl.envs.utils import step_mdp

from tdcollect.envs import ArgumentError, ParallelEnv, SerialEnv, WorkerError, move_transforms_to_workers
from tests.helpers import PixelEpisodesEnv

STANDINS = Path(__file__).resolve().parent.parent / "benchmarks" / "sota_standins"


@pytest.fixture(autouse=True, scope="module")
def torchvision_for_resize():
    """TorchRL's ``Resize`` calls torchvision's ``resize``; where torchvision is not installed (no CPU wheel matches
    this project's torch), the benchmarks' stand-in (``torch.nn.functional.interpolate``) takes its place for
    this module's tests, then is taken away."""
    if importlib.util.find_spec("torchvision") is not None:
        yield
        return
    from torchrl.envs.transforms import _observation

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(STANDINS))
        patch.setattr(_observation, "_has_tv", True)
        yield
    for name in [name for name in sys.modules if name.split(".")[0] == "torchvision"]:
        del sys.modules[name]


def make_base_env():
    """As ``utils_atari.make_base_env``: a TorchRL env of the pixel env with random no-op resets."""
    return TransformedEnv(GymWrapper(PixelEpisodesEnv(), categorical_action_encoding=True),
                          NoopResetEnv(noops=3, random=True))


def atari_transforms() -> list:
    """``utils_atari.make_parallel_env``'s transforms, in its order (``VecNorm`` last)."""
    return [RenameTransform(in_keys=["pixels"], out_keys=["pixels_int"]),
            ToTensorImage(in_keys=["pixels_int"], out_keys=["pixels"]), GrayScale(), Resize(84, 84),
            CatFrames(N=4, dim=-3), RewardSum(), StepCounter(max_steps=9), SignTransform(in_keys=["reward"]),
            DoubleToFloat(), VecNorm(in_keys=["pixels"])]


def pipeline() -> TransformedEnv:
    env = TransformedEnv(ParallelEnv(2, make_base_env, envs_per_worker=2))
    for transform in atari_transforms():
        env.append_transform(transform)
    return env


def run(env, steps: int = 50):
    """A seeded random-action rollout, the resets of the envs its last step ended (``maybe_reset``, as the next
    ``step_and_maybe_reset`` would), then a reset of env 1 alone and a few more steps. (Without the first, a
    ``VecNorm`` in this process, which updates its statistics with every row at every reset, would see an ended
    env's last frame when its transforms run here and its reset frame when they ran in its worker; see the
    docs.)"""
    env.set_seed(3)  # (a seed whose rollout has the episode ends the test asks for: the workers' RNG takes it too)
    torch.manual_seed(3)
    first = env.rollout(steps, break_when_any_done=False)
    state = env.maybe_reset(step_mdp(first[:, -1]))
    partial = state.clone()
    partial.set("_reset", torch.tensor([False, True, False, False]).unsqueeze(-1))
    after_reset = env.reset(partial)
    second = env.rollout(5, break_when_any_done=False, auto_reset=False, tensordict=after_reset)
    return first, after_reset, second


def assert_same(a, b):
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        assert a.get(key).dtype == b.get(key).dtype, key
        assert torch.equal(a.get(key), b.get(key)), f"{key} differs"


@pytest.mark.timeout(300)
def test_the_ppo_atari_transforms_give_the_same_data_in_the_workers():
    main_side = pipeline()  # (the workers' torch RNG, which NoopResetEnv draws from, is seeded by set_seed)
    moved = move_transforms_to_workers(pipeline())
    try:
        assert main_side.base_env.is_closed is False
        assert isinstance(moved.base_env, ParallelEnv) and moved.base_env.worker_transform is not None
        assert [type(t).__name__ for t in moved.transform] == ["VecNorm"]  # the rest runs in the workers
        assert moved.observation_spec == main_side.observation_spec
        assert moved.full_done_spec == main_side.full_done_spec
        expected = run(main_side)
        got = run(moved)
        done = expected[0].get(("next", "done"))
        assert done.any(1).all() and not done.all(), "the envs must end at different steps"
        assert (expected[0].get(("next", "step_count")) == 9).any(), "StepCounter must truncate some episodes"
        assert expected[0][:, -1].get(("next", "done")).any(), "an env must end at the rollout's last step"
        for a, b in zip(expected, got):
            assert_same(a, b)
        assert got[0].get("pixels").shape == (4, 50, 4, 84, 84)
        assert got[0].get("pixels_int").dtype == torch.uint8
    finally:
        main_side.close()
        moved.close()


def make_seeded_env():
    """The pixel env alone: its data depends on its seed and the actions only (``NoopResetEnv`` draws from the
    torch RNG of the process it runs in, which differs between a SerialEnv and a ParallelEnv)."""
    return GymWrapper(PixelEpisodesEnv(), categorical_action_encoding=True)


@pytest.mark.timeout(120)
def test_a_worker_transform_equals_a_serial_env_under_the_same_transform():
    head = Compose(*atari_transforms()[:-1])
    parallel = ParallelEnv(2, make_seeded_env, envs_per_worker=2, worker_transform=head)
    serial = TransformedEnv(SerialEnv(4, make_seeded_env), head.clone())
    try:
        assert_same(run(serial)[0], run(parallel)[0])
    finally:
        parallel.close()
        serial.close()


def test_vecnorm_is_refused_in_the_workers_with_the_way_out():
    with pytest.raises(ArgumentError, match=r"VecNorm.*append it in\s+this process"):
        ParallelEnv(2, make_base_env, worker_transform=Compose(GrayScale(), VecNorm(in_keys=["pixels"])))


@pytest.mark.parametrize("bad", [GrayScale, "GrayScale", 3])
def test_a_worker_transform_must_be_a_transform_or_a_function(bad):
    with pytest.raises(ArgumentError, match="worker_transform must be a TorchRL Transform"):
        ParallelEnv(1, make_base_env, worker_transform=bad)


def test_a_function_returning_no_transform_is_a_clear_error():
    with pytest.raises(WorkerError, match="worker_transform returned int, not a TorchRL Transform"):
        ParallelEnv(1, make_base_env, worker_transform=lambda: 3)


def test_move_transforms_to_workers_takes_only_a_transformed_parallel_env():
    with pytest.raises(ArgumentError, match=r"takes TransformedEnv\(ParallelEnv.*got SerialEnv"):
        move_transforms_to_workers(SerialEnv(1, make_base_env))
    single = TransformedEnv(ParallelEnv(1, make_base_env, serial_for_single=True), GrayScale(in_keys=["pixels"]))
    try:  # TorchRL's scripts build their proof env so: no workers, the transforms stay where they are
        assert move_transforms_to_workers(single) is single
    finally:
        single.close()


def test_a_partial_step_is_refused_with_a_worker_transform():
    env = ParallelEnv(1, make_base_env, envs_per_worker=2, worker_transform=StepCounter())
    try:
        td = env.rand_action(env.reset())
        td.set("_step", torch.tensor([True, False]))
        with pytest.raises(WorkerError, match="step together"):
            env.step(td)
    finally:
        env.close()


@pytest.mark.timeout(180)
def test_collectors_take_a_parallel_env_with_a_worker_transform():
    from tdcollect.collectors import Collector, MultiSyncCollector

    def make_env():  # seeded: the env's episodes end at random, and this seed gives 5-step ones in the last batch
        env = ParallelEnv(2, make_seeded_env, worker_transform=Compose(StepCounter(max_steps=5), RewardSum()))
        env.set_seed(3)
        return env

    for collector in (Collector(make_env, None, frames_per_batch=20, total_frames=40),
                      MultiSyncCollector([make_env], None, frames_per_batch=20, total_frames=40)):
        try:
            batches = list(collector)
        finally:
            collector.shutdown()
        assert len(batches) == 2
        steps = batches[-1].get(("next", "step_count"))
        assert steps.shape[-3:] == (2, 10, 1) and steps.max() == 5 and steps.min() >= 1
        assert batches[-1].get(("next", "truncated"))[steps == 5].all()


def test_a_transform_that_cannot_be_sent_is_a_clear_error():
    import threading

    unsendable = StepCounter()
    unsendable.lock_of_mine = threading.Lock()
    with pytest.raises(ArgumentError, match="worker_transform cannot be sent to a worker process.*pass a function"):
        ParallelEnv(1, make_base_env, worker_transform=unsendable)


def test_a_vecnorm_inside_a_nested_compose_stays_in_this_process():
    env = TransformedEnv(ParallelEnv(1, make_seeded_env, envs_per_worker=2),
                         Compose(StepCounter(), Compose(VecNorm(in_keys=["pixels"]))))
    moved = move_transforms_to_workers(env)
    try:
        assert [type(t).__name__ for t in moved.base_env.worker_transform] == ["StepCounter"]
        assert [type(t).__name__ for t in moved.transform] == ["Compose"]
        assert moved.observation_spec["step_count"].shape == (2, 1)
    finally:
        moved.close()


def test_a_parallel_env_is_built_again_with_every_argument_of_its_own():
    import inspect

    env = ParallelEnv(1, make_seeded_env, envs_per_worker=2, timeout=30.0)
    try:
        taken = set(inspect.signature(ParallelEnv.__init__).parameters) - {"self", "torchrl_options"}
        # serial_for_single only acts in __new__ (one worker: a SerialEnv); worker_transform is what changes
        assert set(env._arguments) == taken - {"serial_for_single", "worker_transform"}
    finally:
        env.close()
