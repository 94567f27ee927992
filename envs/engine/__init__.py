"""The engine: envs in worker processes, stepped through shared-memory buffers. It knows no env family (those are in
``tdcollect.envs.libs``, handed to it as :class:`~.stepper.Family` objects) and no face. Its modules::

    protocol.py         the worker protocol: every command and status code, the wait strategy, WorkerChannel
    pool.py             WorkerPool: start, send / wait (first-ready or all), restarts, close
    worker.py           a ParallelEnv worker's process body: build its envs, serve the protocol
    group.py            EnvGroup: k envs in one process stepping into a [k] slice of the buffers; seed chain
    stepper.py          the Stepper / Family contract and the dispatch from an env to its stepper
    shared.py           shared-memory buffers (EnvSpecs, BufferViews, mapped segments) and their checks
    handshake.py        the start-up handshake: workers' specs agreed, buffers allocated once
    recycle.py          recycled storage for outputs and rollouts (memory paid once, not per call)
    recording.py        StepRecorder: step buffers -> [*batch, T] rollout storage
    worker_rollout.py   rollouts the workers record themselves, one command per span of steps
    platform_policy.py  start method, cores and threads, the main guard
    preload.py          costly imports paid once before workers start
    specs.py            the specs every env shares; spec agreement checks
    values.py           value checks: nothing is cast into another value, nothing is broadcast
    errors.py           the errors users see, and how a worker's exception travels
    user_warnings.py    warnings that point at the caller's line
"""
