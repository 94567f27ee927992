"""Error messages that tell the user what to do: a missing optional package, and an env instance passed
where a constructor is expected (the suggested call must itself be valid for the class that raised)."""
import functools
import inspect
import re
import sys
import warnings

import gymnasium
import pytest
import torch
from torchrl.envs import StepCounter, TransformedEnv

import tdcollect.envs
from tdcollect.collectors import MultiSyncCollector
from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.engine import user_warnings
from tdcollect.envs.factories import check_factory
from tests.helpers import CountingEnv

pytestmark = pytest.mark.timeout(60)


# ----------------------------------------------------------------- DMLab2dEnv without dmlab2d
@pytest.fixture
def without_dmlab2d(monkeypatch):
    """As if dmlab2d were not installed: ``import dmlab2d`` fails, and tdcollect.envs.libs.dmlab2d is imported
    afresh on the next access (monkeypatch puts both entries back afterwards)."""
    monkeypatch.setitem(sys.modules, "dmlab2d", None)
    monkeypatch.delitem(sys.modules, "tdcollect.envs.libs.dmlab2d", raising=False)


INSTALL_HINT = r'pip install "tdcollect\[dmlab2d\]"'


def test_dmlab2d_env_without_dmlab2d_says_how_to_install_it(without_dmlab2d):
    with pytest.raises(ImportError, match=INSTALL_HINT) as info:
        tdcollect.envs.DMLab2dEnv  # noqa: B018 - the attribute access imports the module
    assert isinstance(info.value, ModuleNotFoundError) and info.value.name == "dmlab2d"
    assert "DMLab2dEnv needs the optional dmlab2d package" in str(info.value)


def test_importing_and_constructing_dmlab2d_env_without_dmlab2d_says_how_to_install_it(without_dmlab2d):
    with pytest.raises(ImportError, match=INSTALL_HINT):
        from tdcollect.envs import DMLab2dEnv

        DMLab2dEnv("commons_harvest")


def test_dmlab2d_env_still_imports_when_dmlab2d_is_there():
    pytest.importorskip("dmlab2d")
    assert tdcollect.envs.DMLab2dEnv.__name__ == "DMLab2dEnv"


# ----------------------------------------------------------------- env instance instead of a constructor
def _ray_collector():
    pytest.importorskip("ray")
    from tdcollect.collectors import RayCollector

    return RayCollector


OWNERS = {
    "ParallelEnv": lambda: ParallelEnv,
    "SerialEnv": lambda: SerialEnv,
    "MultiSyncCollector": lambda: MultiSyncCollector,
    "RayCollector": _ray_collector,
}
EXPECTED = {
    "ParallelEnv": ["ParallelEnv(4, lambda: CountingEnv(...))", "ParallelEnv(4, functools.partial(CountingEnv, ...))"],
    "SerialEnv": ["SerialEnv(4, lambda: CountingEnv(...))", "SerialEnv(4, functools.partial(CountingEnv, ...))"],
    "MultiSyncCollector": ["MultiSyncCollector([lambda: CountingEnv(...)] * 4)",
                           "MultiSyncCollector(lambda: CountingEnv(...), num_workers=4)"],
    "RayCollector": ["RayCollector([lambda: CountingEnv(...)] * 4)",
                     "RayCollector(lambda: CountingEnv(...), num_workers=4)"],
}


def _suggestions(message: str) -> list[str]:
    """The example calls at the end of a message: ``..., e.g. A or B.``"""
    match = re.search(r"e\.g\. (.*)\.$", message)
    assert match, message
    return match.group(1).split(" or ")


def _raise_with_instance(owner: str, instance) -> str:
    """Construct ``owner`` the way a user who passes an instance would; return the TypeError's message."""
    cls = OWNERS[owner]()
    with pytest.raises(TypeError, match="not an env instance") as info:
        if owner in ("ParallelEnv", "SerialEnv"):
            cls(4, instance)
        else:
            cls(instance, None, frames_per_batch=8, total_frames=8)
    return str(info.value)


def _accepted_by_signature(owner: str, call: str) -> None:
    """Evaluate ``call`` with ``owner`` standing for a function of the owner's signature that only binds
    its arguments (a TypeError if the signature refuses them) and the constructor's ``...`` kept as is."""
    signature = inspect.signature(OWNERS[owner]().__init__)  # TorchRL's env metaclass hides the class's own
    namespace = {owner: lambda *args, **kwargs: signature.bind("self", *args, **kwargs), "CountingEnv": CountingEnv,
                 "functools": functools, "gymnasium": gymnasium}
    bound = eval(call, namespace)  # noqa: S307 - our own message
    factory = bound.arguments["create_env_fn"]
    if isinstance(factory, list):
        factories = factory
    else:
        count = bound.arguments.get("num_envs", bound.arguments.get("num_workers"))
        assert isinstance(count, int), f"{call}: no count of envs / workers"
        factories = [factory] * count
    assert len(factories) == 4 and all(callable(f) for f in factories), call


@pytest.mark.parametrize("owner", list(OWNERS))
def test_env_instance_error_suggests_a_call_the_owner_accepts(owner):
    message = _raise_with_instance(owner, CountingEnv())
    assert message.startswith(f"{owner} takes a function that builds an env, not an env instance "
                              "(got a CountingEnv object).")
    suggestions = _suggestions(message)
    assert suggestions == EXPECTED[owner]
    for call in suggestions:
        _accepted_by_signature(owner, call)


@pytest.mark.parametrize("owner", list(OWNERS))
def test_gymnasium_make_instance_is_suggested_as_gymnasium_make(owner):
    """An env made by gymnasium.make is a TimeLimit (or other wrapper): the suggestion rebuilds it by id."""
    env = gymnasium.make("CartPole-v1")
    try:
        message = _raise_with_instance(owner, env)
    finally:
        env.close()
    assert "(got a TimeLimit object)" in message
    suggestions = _suggestions(message)
    assert all("lambda: gymnasium.make('CartPole-v1')" in call for call in suggestions)
    for call in suggestions:
        _accepted_by_signature(owner, call)


@pytest.mark.parametrize("owner", list(OWNERS))
def test_non_callable_error_suggests_a_call_the_owner_accepts(owner):
    cls = OWNERS[owner]()
    with pytest.raises(TypeError, match="takes a callable that builds an env, got str 'CartPole-v1'") as info:
        if owner in ("ParallelEnv", "SerialEnv"):
            cls(2, "CartPole-v1")
        else:
            cls("CartPole-v1", None, frames_per_batch=8, total_frames=8)
    for call in _suggestions(str(info.value)):
        assert owner in call and "gymnasium.make('CartPole-v1')" in call
        _accepted_by_signature(owner, call)


@pytest.mark.parametrize("owner", ["SerialEnv", "ParallelEnv"])
def test_suggested_env_calls_really_run(owner):
    """Run each suggestion for the batched envs, with ``...`` dropped from the constructor."""
    cls = OWNERS[owner]()
    for call in _suggestions(_raise_with_instance(owner, CountingEnv())):
        runnable = call.replace("CountingEnv(...)", "CountingEnv()").replace("functools.partial(CountingEnv, ...)",
                                                                             "functools.partial(CountingEnv)")
        kwargs = ", mp_start_method='fork')" if owner == "ParallelEnv" else ")"
        runnable = runnable[:-1] + kwargs
        with eval(runnable, {owner: cls, "CountingEnv": CountingEnv, "functools": functools}) as env:  # noqa: S307
            assert env.rollout(2)["next", "observation"].shape == (4, 2, 3)


def test_owner_without_a_known_signature_gets_the_constructor_only():
    from tdcollect.envs.factories import example_calls

    with pytest.raises(TypeError, match=r"e\.g\. a constructor such as lambda: CountingEnv\(\.\.\.\)\.$"):
        check_factory(CountingEnv(), "SomethingElse")
    assert example_calls("AsyncParallelEnv", "MyEnv(...)") == (
        "AsyncParallelEnv(4, lambda: MyEnv(...), batch_workers=2) or "
        "AsyncParallelEnv(4, functools.partial(MyEnv, ...), batch_workers=2)")
    from tdcollect.envs import AsyncParallelEnv

    inspect.signature(AsyncParallelEnv.__init__).bind("self", 4, lambda: CountingEnv(), batch_workers=2)


# ----------------------------------------------------------------- warnings point at the caller's line
def _pendulum():
    return gymnasium.make("Pendulum-v1")


def _nan_action(td):
    return td.set("action", torch.tensor([[float("nan")], [0.0]]))


def _located(caught, text: str) -> list[tuple[str, int]]:
    return [(w.filename, w.lineno) for w in caught if text in str(w.message)]


@pytest.mark.parametrize("road", ["step", "step_and_maybe_reset", "TransformedEnv.step"])
def test_an_action_warning_points_at_the_line_that_stepped(road):
    """Whatever road the step took through our code and TorchRL's, the warning names the caller's file and line
    (not a line of ours), so that the user sees which of their calls sent the actions."""
    with SerialEnv(2, _pendulum) as env:
        stepped = TransformedEnv(env, StepCounter()) if road == "TransformedEnv.step" else env
        step = stepped.step_and_maybe_reset if road == "step_and_maybe_reset" else stepped.step
        td = _nan_action(stepped.reset())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = sys._getframe().f_lineno + 1
            step(td)
    assert _located(caught, "outside its spec") == [(__file__, line)]


def test_a_deprecated_argument_warning_points_at_the_constructors_caller(no_leaks):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        env = ParallelEnv(1, _pendulum, pipeline=False)
    env.close()
    assert _located(caught, "pipeline=...) has no effect") == [(__file__, line)]
    with pytest.raises(tdcollect.envs.ArgumentError, match="unexpected keyword arguments.*pipeline"):
        SerialEnv(1, _pendulum, pipeline=False)  # a ParallelEnv argument only


def test_warn_caller_falls_back_to_its_caller_when_every_frame_is_passed_through(monkeypatch):
    """As in a worker process, where no frame is the user's: the warning names warn_caller's caller."""
    every, frame = set(), sys._getframe()
    while frame is not None:
        every.add(frame.f_globals.get("__name__", "").split(".")[0])
        frame = frame.f_back
    monkeypatch.setattr(user_warnings, "PASSED_THROUGH", every)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        user_warnings.warn_caller("from nowhere of the user's")
    assert _located(caught, "from nowhere") == [(__file__, line)]
