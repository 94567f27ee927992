"""TorchRL's transforms run natively, on TorchRL's map (``torchrl/envs/transforms/``)::

    ops.py      one op per TorchRL transform with a native version, over a group's ``[k]`` rows
    native.py   NativeTransformedGroup: a group's envs stepped into local buffers, the ops over their rows
    per_env.py  TorchRL's ``TransformedEnv(GymEnv(...), transforms)`` per env, regrouped onto the native group

Adding an op is one class in ``ops.py`` and its case in ``op_for``. The worker transforms (``worker_transform=``,
``move_transforms_to_workers``) are a face above (``envs/worker_transforms.py``), on the same native group.
"""
