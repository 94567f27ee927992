"""Adding an env family is adding one module: ``tests/family_example.py`` (a native engine with its own API and its
``FAMILY``) steps in SerialEnv and ParallelEnv, under fork and spawn, once registered; the built-in families are
found by the registry, and an env no family claims is a clear error."""
import pytest
import torch

from tdcollect.envs import ParallelEnv, SerialEnv
from tdcollect.envs.engine.stepper import Family, Stepper, make_stepper
from tdcollect.envs.errors import ConstructorError
from tdcollect.envs.libs import register, registered
from tests import family_example
from tests.family_example import Abacus

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def abacus_family():
    register(family_example.FAMILY)
    return family_example.FAMILY


def test_the_built_in_families_are_registered_in_order():
    names = [family.name for family in registered()]
    for name in ("gymnasium", "TorchRL EnvBase", "dm_env", "dmlab2d", "MeltingPot", "PettingZoo"):
        assert name in names
    assert names.index("gymnasium") < names.index("TorchRL EnvBase") < names.index("dm_env")


def test_an_env_no_family_claims_is_a_type_error_naming_the_families():
    others = [family for family in registered() if family.name != "abacus"]
    with pytest.raises(TypeError, match=r"tests\.family_example\.Abacus, which is not an env it can step.*gymnasium"):
        make_stepper(Abacus(), others, owner="SerialEnv")


def test_the_stepper_meets_the_protocol(abacus_family):
    stepper = make_stepper(Abacus(), registered())
    assert isinstance(stepper, Stepper) and type(stepper).__name__ == "AbacusStepper"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_new_family_steps_in_parallel_as_in_serial(abacus_family, start_method, no_leaks):
    serial = SerialEnv(4, Abacus)
    parallel = ParallelEnv(2, Abacus, envs_per_worker=2, mp_start_method=start_method)
    try:
        assert parallel.observation_spec["count"].dtype == torch.int64
        outputs = []
        for env in (serial, parallel):
            env.set_seed(3)
            torch.manual_seed(0)
            outputs.append(env.rollout(40, break_when_any_done=False))
        expected, got = outputs
        assert (got == expected).all(), "ParallelEnv and SerialEnv differ on the new family"
        assert got["next", "done"].any(), "no episode ended: the auto-reset went untested"
        counts = got["next", "count"].squeeze(-1)
        steps = got["action"] - 1
        assert (counts[:, 1:] - got["count"].squeeze(-1)[:, 1:] == steps[:, 1:]).all()
    finally:
        serial.close()
        parallel.close()


def test_an_instance_of_the_new_family_is_refused(abacus_family):
    refused = r"not an env instance \(got a Abacus object\).*lambda: Abacus\(\.\.\.\)"
    with pytest.raises(ConstructorError, match=refused):
        ParallelEnv(2, Abacus())


def test_register_takes_only_a_family():
    with pytest.raises(TypeError, match="takes a tdcollect.envs.engine.stepper.Family"):
        register(object())
    assert Family(name="x").stepper(object()) is None
