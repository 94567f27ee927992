"""RayCollector on a local 2-CPU Ray cluster: MultiSyncCollector's batches, weight updates, actors killed
mid-run, errors, shutdown without leftovers, and ray kept out of ``import tdcollect.collectors``."""
import functools
import os
import signal
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict

ray = pytest.importorskip("ray")

from tdcollect.collectors import Collector, MultiSyncCollector  # noqa: E402
from tdcollect.envs import EnvWorkerError, SpecMismatchError  # noqa: E402
from tests.conftest import wait_gone  # noqa: E402
from tests.helpers import BoundedObsEnv, CountingEnv, CrashOnceEnv, FaultyEnv, cartpole  # noqa: E402
from tests.test_collectors import KEYS, ConstantAction, mlp_policy  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
long_counting = functools.partial(CountingEnv, episode_len=100)


@pytest.fixture(scope="module")
def ray_cluster():
    """One local cluster for the module (starting one costs seconds); the collectors join it."""
    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.mark.long  # (a minute or so of Ray on 2 cores: in the long tier, which CI runs)
def test_same_batches_as_multisync(ray_cluster):
    from tdcollect.collectors import RayCollector

    torch.manual_seed(0)
    policy = mlp_policy()
    kwargs = dict(frames_per_batch=20, total_frames=60)
    with MultiSyncCollector([cartpole] * 2, policy, **kwargs) as multi:
        multi.set_seed(7)
        expected = list(multi)
    with RayCollector([cartpole] * 2, policy, **kwargs) as collector:
        assert collector.envs_per_worker == [1, 1] and len(collector) == 3
        collector.set_seed(7)
        batches = list(collector)
        pids = collector.worker_pids
        assert collector.weight_versions == [0, 0] and collector.restarts == [0, 0]
    assert not wait_gone(pids, within=10.0), "shutdown() left actor processes behind"
    # TorchRL's entry point: Collector(..., backend="ray", num_collectors=N, sync=True) is our RayCollector
    with Collector(cartpole, policy, backend="ray", num_collectors=2, sync=True, **kwargs) as entry:
        assert type(entry) is RayCollector and entry.num_workers == 2
        entry.set_seed(7)
        by_entry = list(entry)
    assert len(batches) == len(expected) == len(by_entry) == 3
    for batch, reference, other in zip(batches, expected, by_entry):
        assert batch.batch_size == reference.batch_size == (2, 10)
        assert set(batch.keys(True, True)) == set(reference.keys(True, True)) == KEYS
        for key in KEYS:  # same seeds, same policy: the very same data
            assert torch.equal(batch[key], reference[key]) and torch.equal(other[key], reference[key]), key


@pytest.mark.long  # (a minute or so of Ray on 2 cores: in the long tier, which CI runs)
def test_weight_updates_reach_every_actor(ray_cluster):
    from tdcollect.collectors import RayCollector
    from tdcollect.envs import SerialEnv

    def two_envs():
        return SerialEnv(2, long_counting)

    policy = ConstantAction(3, favourite=0)
    with RayCollector(two_envs, policy, num_workers=2, frames_per_batch=40, total_frames=-1,
                      init_random_frames=40, num_cpus=0.5) as collector:
        batches = iter(collector)
        first = next(batches)
        assert first.batch_size == (4, 10) and collector.envs_per_worker == [2, 2]
        assert (first["action"] != 0).any()  # init_random_frames
        assert torch.equal(first["collector", "traj_ids"][:, 0], torch.arange(4))
        assert (next(batches)["action"] == 0).all()
        with torch.no_grad():
            policy.bias.copy_(torch.tensor([0.0, 0.0, 1.0]))
        assert (next(batches)["action"] == 0).all()  # not published yet
        collector.update_policy_weights_()
        assert (next(batches)["action"] == 2).all()
        assert collector.weight_versions == [1, 1]
        collector.update_policy_weights_(TensorDict({"bias": torch.tensor([0.0, 1.0, 0.0])}, []))
        assert (next(batches)["action"] == 1).all()
        assert collector.weight_versions == [2, 2]


@pytest.mark.long  # (a minute or so of Ray on 2 cores: in the long tier, which CI runs)
def test_killed_actors_are_restarted_and_batches_stay_full(ray_cluster, tmp_path):
    from tdcollect.collectors import RayCollector

    marker = str(tmp_path / "crashed")
    factories = [long_counting, functools.partial(CrashOnceEnv, marker, "kill", at_step=3)]
    policy = ConstantAction(3, favourite=0)
    with pytest.warns(RuntimeWarning, match="Ray restarted actor"):
        with RayCollector(factories, policy, frames_per_batch=20, total_frames=-1, max_restarts=3) as collector:
            batches = iter(collector)
            first = next(batches)  # actor 1 kills itself at its 3rd step; Ray restarts it, the batch is refilled
            assert os.path.exists(marker) and collector.restarts == [0, 1]
            assert first.batch_size == (2, 10)
            assert torch.equal(first["observation"][1, :, 0], torch.arange(10.0))  # one fresh episode
            assert first["collector", "traj_ids"].unique().numel() == 2

            with torch.no_grad():
                policy.bias.copy_(torch.tensor([0.0, 0.0, 1.0]))
            collector.update_policy_weights_()
            ray.kill(collector.actors[0], no_restart=False)  # between batches, through Ray
            second = next(batches)
            assert collector.restarts == [1, 1]
            assert second.batch_size == (2, 10) and second.numel() == 20
            assert (second["action"] == 2).all() and collector.weight_versions == [1, 1]  # latest weights
            assert second["observation"][0, 0, 0] == 0  # the rebuilt env starts a new episode
            assert second["observation"][1, 0, 0] == first["observation"][1, -1, 0] + 1  # the other goes on
            ids, old_ids = second["collector", "traj_ids"], first["collector", "traj_ids"]
            assert ids[0, 0] not in old_ids and ids[1, 0] == old_ids[1, -1]
            pids = collector.worker_pids
    assert not wait_gone(pids, within=10.0)


@pytest.mark.long  # (a minute or so of Ray on 2 cores: in the long tier, which CI runs)
def test_actor_dying_past_max_restarts_is_a_clear_error(ray_cluster):
    from tdcollect.collectors import RayCollector
    from tdcollect.collectors.distributed.ray import RayWorkerDiedError

    collector = RayCollector(long_counting, None, frames_per_batch=20, total_frames=-1, max_restarts=0)
    batches = iter(collector)
    next(batches)
    pid = collector.worker_pids[0]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RayWorkerDiedError, match=rf"Ray actor 0 \(last pid {pid}\) died during collection"):
        next(batches)
    assert collector.actors == [] and collector.worker_pids == []


@pytest.mark.long  # (a minute or so of Ray on 2 cores: in the long tier, which CI runs)
def test_env_errors_name_the_actor_and_shut_down(ray_cluster):
    from tdcollect.collectors import RayCollector

    with pytest.raises(EnvWorkerError, match=r"worker 0 raised ValueError during construction: boom in __init__"):
        RayCollector(functools.partial(FaultyEnv, "init"), None, frames_per_batch=20)
    collector = RayCollector(functools.partial(FaultyEnv, "step", at_step=4), None, frames_per_batch=20,
                             total_frames=100)
    pids = collector.worker_pids
    with pytest.raises(EnvWorkerError, match=r"worker 0 raised ValueError during collection: boom in step 4"):
        list(collector)
    assert collector.actors == [] and not wait_gone(pids, within=10.0)


@pytest.mark.long  # (a minute or so of Ray on 2 cores: in the long tier, which CI runs)
def test_actors_with_other_specs_are_a_clear_error(ray_cluster):
    from tdcollect.collectors import RayCollector

    with pytest.raises(SpecMismatchError, match=r"actor 1 has other specs than actor 0.*observation.*same specs"):
        RayCollector([CountingEnv, cartpole], None, frames_per_batch=20)
    # the bounds alone differ: refused too, as MultiSyncCollector refuses it
    with pytest.raises(SpecMismatchError, match=r"actor 1 has other specs than actor 0.*observation.*same specs"):
        RayCollector([functools.partial(BoundedObsEnv, 1.0), functools.partial(BoundedObsEnv, 2.0)], None,
                     frames_per_batch=20)


def test_bad_arguments():
    from tdcollect.collectors import RayCollector

    with pytest.raises(ValueError, match="num_cpus must be a number"):
        RayCollector([CountingEnv], None, frames_per_batch=20, num_cpus=-1)
    with pytest.raises(ValueError, match="max_restarts must be an int"):
        RayCollector([CountingEnv], None, frames_per_batch=20, max_restarts=-2)
    with pytest.raises(ValueError, match="needs num_gpus > 0"):
        RayCollector([CountingEnv], None, frames_per_batch=20, policy_device="cuda")
    with pytest.raises(TypeError, match="not an env instance"):
        RayCollector([CountingEnv()], None, frames_per_batch=20)


_OWN_CLUSTER = """
import sys, time
sys.path.insert(0, {root!r})
import psutil, ray
from tdcollect.collectors import RayCollector
from tests.helpers import CountingEnv

collector = RayCollector(CountingEnv, None, frames_per_batch=20, total_frames=40,
                         ray_init_kwargs={{"num_cpus": 2}})
list(collector)
started = psutil.Process().children(recursive=True)
names = sorted({{p.name() for p in started}})
collector.shutdown()
assert not ray.is_initialized()
gone, alive = psutil.wait_procs(started, timeout=15)
print("NAMES", names)
print("ALIVE", [(p.pid, p.name()) for p in alive])
"""


@pytest.mark.long  # (a minute or so of Ray on 2 cores: in the long tier, which CI runs)
def test_shutdown_stops_the_cluster_it_started():
    script = _OWN_CLUSTER.format(root=ROOT)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("NAMES", "ALIVE")))
    assert "raylet" in lines["NAMES"] and "gcs_server" in lines["NAMES"], lines
    assert lines["ALIVE"] == "[]", f"Ray processes left after shutdown(): {lines['ALIVE']}"


_WITH_RAY = """
import sys
import tdcollect.collectors
assert "tdcollect.collectors.distributed.ray" not in sys.modules
from tdcollect.collectors import RayCollector
assert "tdcollect.collectors.distributed.ray" in sys.modules
"""

_WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # as if ray were not installed (torchrl then skips it too)
import tdcollect.collectors
assert not [name for name, module in sys.modules.items() if name.startswith("ray.") and module is not None]
try:
    from tdcollect.collectors import RayCollector
except ImportError as exc:
    assert 'pip install "tdcollect[ray]"' in str(exc), str(exc)
else:
    raise AssertionError("no ImportError without ray")
"""


@pytest.mark.parametrize("script", [_WITH_RAY, _WITHOUT_RAY], ids=["ray-installed", "ray-missing"])
def test_importing_collectors_does_not_import_ray_collector(script):
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
