#!/bin/bash
# The GPU check (see prepare.sh): run on the GPU machine from the repository root, with .whl/ and .dev/ carried and
# $OUT an output folder. Installs the wheels, runs tests/test_cuda.py, the device-related TorchRL env tests with
# ours, a collector-test selection with ours and with TorchRL's classes side by side, and benchmarks/gpu_policy.py;
# logs come back as $OUT/logs.tgz. About 6 minutes on a 16-core H200 machine.
export PYTHONUNBUFFERED=1 ROOT=$PWD
L=$OUT/logs; mkdir -p $L
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
mkdir -p /tmp/pkg/tdcollect && ln -sfn $ROOT/envs /tmp/pkg/tdcollect/envs && ln -sfn $ROOT/collectors /tmp/pkg/tdcollect/collectors
export PYTHONPATH=/tmp/pkg:/tmp/site
{ nproc; nvidia-smi -L; python3 -V; python3 -c "
import torch, tensordict, torchrl, gymnasium, tdcollect.envs, tdcollect.collectors
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'td', tensordict.__version__, 'rl', torchrl.__version__, 'gym', gymnasium.__version__)"; } > $L/setup.log 2>&1
cat $L/setup.log
grep -q "cuda True" $L/setup.log || [ -n "${DRY:-}" ] || { tail -20 $L/pip.log; exit 3; }
T=$ROOT/.dev/torchrl-tests/test
PP=$ROOT/.ci/torchrl_suite:$PYTHONPATH
P="python3 -m pytest -p swap_plugin -p no:cacheprovider -v -rfE --timeout 120 --tb=line -W ignore::DeprecationWarning"
ENVS="envs/test_parallel.py envs/test_auto_reset.py envs/test_nested.py envs/test_special.py envs/test_env_base.py"
COLS="test_collectors.py collectors/test_evaluator.py compile/test_compile_collectors.py"
t0=$(date +%s)
(cd $ROOT && timeout 150 python3 -m pytest -v -p no:cacheprovider tests/test_cuda.py --junitxml=$L/gpu_tests.xml > $L/gpu_tests.log 2>&1) &
(cd $T && PYTHONPATH=$PP TDSWAP=ours TDSWAP_SUITE=envs TDSWAP_ONLY_PARALLEL=1 timeout 150 $P -n 3 $ENVS -k "device or cast or partial or backprop" > $L/env_ours.log 2>&1) &
for who in ours torchrl; do
  (cd $T && PYTHONPATH=$PP TDSWAP=$who TDSWAP_SUITE=collectors timeout 150 $P -n 5 $COLS -k "test_reset_heterogeneous_envs or test_update_weights or test_auto_wrap_modules or TestUpdateParams or test_no_synchronize or test_output_device or test_collector_device_combinations or test_concurrent_collector_seed or TestPolicyFactory or test_collector_with_rb_uses_lazy_stack or test_policy_with_mask or test_no_deepcopy_policy or test_multi_collector_heterogeneous_env_consistency or test_multi_collector_nested_env_consistency or test_multisync_collector_interruptor_mechanism or test_reset_flushes_assembly_state or test_sequence_inference or TestCollectorProfiling" > $L/col_$who.log 2>&1) &
done
wait
echo "tests took $(( $(date +%s) - t0 )) s"
for f in $L/*.log; do echo "== $f $(grep -c " PASSED" $f) passed $(grep -c " FAILED" $f) failed $(grep -c " SKIPPED" $f) skipped"; grep -E "^(FAILED|ERROR)| FAILED | ERROR " $f | cut -c1-300 | sort -u | head -40; done
cd $ROOT
timeout 200 python3 -m benchmarks.gpu_policy --device ${DEV:-cuda} --workload costly --workers 4 12 --rounds 2 --batches 8 --out $L/gpu_policy.json > $L/gpu_policy.txt 2>&1
grep -A6 "^system" $L/gpu_policy.txt || tail -5 $L/gpu_policy.txt
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
