"""gymnasium's standard Atari preprocessing, stepped natively: ``AtariPreprocessing`` over an ALE env (and the same
under ``FrameStackObservation``) stepped by tdcollect with the ALE itself, giving gymnasium's data bit for bit.

**What a native step does** (one env; what the wrappers do, without what they throw away): for each of the
``frame_skip`` inner frames, ``ale.act(action_set[action], 1.0)`` (the emulator applies sticky actions with its own
RNG), the episode's end read from the ALE (``game_over(with_truncation=False)``, ``game_truncated()``), a
``TimeLimit``'s count if ``gym.make`` added one, a lost life if ``terminal_on_life_loss``; the screen read only at
the last two frames (grayscale or RGB) into ``AtariPreprocessing``'s own two buffers, their max, ``cv2.resize(...,
INTER_AREA)`` to ``screen_size``, scaled by ``1 / 255`` if ``scale_obs``, a channel axis if ``grayscale_newaxis``;
then the stack shifted by one frame. The RGB observation each inner ``AtariEnv.step`` builds, its info dict and the
stack's ``deepcopy`` are never made. An episode that ends before the last two frames returns the max of the buffers
as they are, as ``AtariPreprocessing`` does.

**Resets go through the wrappers themselves** (``env.reset()``): the no-ops drawn from the env's ``np_random``, the
seeding, the stack's padding and the wrappers' state are theirs. So are the first two steps after the env is made
(``gym.make``'s ``PassiveEnvChecker`` checks them). The wrappers' state that steps change is kept up to date
(``AtariPreprocessing``'s buffers, ``lives`` and ``game_over``; a ``TimeLimit``'s ``_elapsed_steps``), so a reset or
an attribute read through the env sees what gymnasium's own steps would have left.

**What it covers**: ``[FrameStackObservation(]AtariPreprocessing(env[, ...])[, stack_size, padding_type=...)]``
where ``env`` is ``gym.make("ALE/...", frameskip=1)`` or ``AtariEnv`` itself, with any options of
``AtariPreprocessing`` (``noop_max``, ``frame_skip``, ``screen_size``, ``terminal_on_life_loss``, ``grayscale_obs``,
``grayscale_newaxis``, ``scale_obs``) and of the stack; between them only ``gym.make``'s own wrappers
(``OrderEnforcing``, ``PassiveEnvChecker``, ``TimeLimit``). Anything else keeps the gymnasium family's road (the
wrappers' own ``step``), with the reason in ``env.roads()``: another wrapper anywhere in the chain, a subclass of
these classes, continuous actions, a stochastic ``frameskip`` of the ALE env, an observation type other than
``"rgb"`` / ``"grayscale"``.

**Where it runs**: :class:`AtariStepper` writes each step into the env's rows of the engine's buffers (and, as
:class:`AtariBlockStepper`, straight into a worker-recorded rollout's columns); :class:`AtariFrames` is the road
itself, whose ``step`` / ``reset`` give what the env's own give (the info dict too) for the faces that call an env's
``step`` (``Family.native_env``: the gymnasium and SB3 faces' worker side, TorchRL's ``GymWrapper`` road). The
road keeps its state in the wrappers themselves (their buffers, lives, frame queue and step count), so a reset or a
step taken through the wrappers from outside (``env_method("step", ...)``) and the road's own steps mix freely.

Nothing of it is compiled here: the emulator is ale-py's, the resize OpenCV's (both already needed by gymnasium's
Atari envs); this module only calls them in the order the wrappers do.
"""
from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, OrderEnforcing, PassiveEnvChecker, TimeLimit

from ..engine.stepper import ROAD_ATTRIBUTE, Family, of_package
from ..engine.values import BadValue
from .gym import GymStepper, Mismatch

#: the road of an env this module steps (``env.roads()``)
NATIVE = "native: gymnasium's Atari preprocessing stepped by tdcollect with the ALE, gymnasium's data"
#: the road of an Atari preprocessing chain it does not cover: the gymnasium family's stepper, with the reason
WRAPPERS_STEP = "gymnasium's wrappers' step"
#: the wrappers ``gym.make`` may put between ``AtariPreprocessing`` and the ALE env (what each does to a step is
#: done natively: nothing after their first steps, or a count)
MAKE_WRAPPERS = (OrderEnforcing, PassiveEnvChecker, TimeLimit)

_LOG = logging.getLogger("tdcollect.envs")


class Chain:
    """The pieces of a covered wrapper chain (see the module docstring): ``stack`` (the ``FrameStackObservation``
    or None), ``preprocessing``, ``time_limit`` and ``checkers`` (the ``TimeLimit``, or None, and the
    ``PassiveEnvChecker`` wrappers among ``make_wrappers``, the ``gym.make`` wrappers under it), ``atari`` (the ALE
    env)."""

    def __init__(self, stack, preprocessing, make_wrappers: list, atari):
        self.stack = stack
        self.preprocessing = preprocessing
        self.time_limit = next((w for w in make_wrappers if type(w) is TimeLimit), None)
        self.checkers = [w for w in make_wrappers if type(w) is PassiveEnvChecker]
        self.atari = atari


def chain_of(env) -> tuple[Chain | None, str | None]:
    """``(chain, None)`` when ``env`` is a covered Atari preprocessing chain; ``(None, reason)`` when it holds an
    ``AtariPreprocessing`` that the native road does not cover; ``(None, None)`` when it holds none."""
    if not _holds_preprocessing(env):
        return None, None
    stack = None
    outer = env
    if type(outer) is FrameStackObservation:
        stack = outer
        outer = outer.env
    if type(outer) is not AtariPreprocessing:
        for kind in (FrameStackObservation, AtariPreprocessing):
            if isinstance(outer, kind):
                return None, f"{type(outer).__name__} is a subclass of {kind.__name__}"
        return None, f"{type(outer).__name__} wraps AtariPreprocessing"
    preprocessing = outer
    make_wrappers = []
    inner = preprocessing.env
    while isinstance(inner, gym.Wrapper):
        if type(inner) not in MAKE_WRAPPERS:
            return None, f"{type(inner).__name__} between AtariPreprocessing and the ALE env"
        make_wrappers.append(inner)
        inner = inner.env
    reason = _why_not_atari(inner)
    if reason is not None:
        return None, reason
    return Chain(stack, preprocessing, make_wrappers, inner), None


def _holds_preprocessing(env) -> bool:
    """Whether an ``AtariPreprocessing`` is somewhere in ``env``'s wrapper chain."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, AtariPreprocessing):
            return True
        env = env.env
    return False


def _why_not_atari(env) -> str | None:
    """None when ``env`` is an ALE ``AtariEnv`` the native road steps; else why not."""
    if not of_package(env, "ale_py") or type(env).__name__ != "AtariEnv":
        return f"the env under AtariPreprocessing is a {type(env).__name__}, not ale_py's AtariEnv"
    if getattr(env, "continuous", False):
        return "continuous actions"
    if type(getattr(env, "_frameskip", None)) is not int:
        return f"the ALE env's frameskip is {getattr(env, '_frameskip', None)!r} (stochastic)"
    if getattr(env, "_obs_type", None) not in ("rgb", "grayscale"):
        return f"obs_type={getattr(env, '_obs_type', None)!r}"
    return None


class AtariFrames:
    """The native road of one covered chain (see the module docstring): its emulation, its frame, its stack.

    ``step(action)`` gives what the chain's ``step`` gives, ``(observation, reward, terminated, truncated, info)``
    (the observation a new array, as the wrappers return one); the steppers use its parts: :meth:`emulate`,
    :meth:`frame`, :meth:`stacked`. Its state is the wrappers' own (``AtariPreprocessing``'s buffers and lives,
    ``FrameStackObservation``'s queue of frames, a ``TimeLimit``'s count), kept as their steps keep it: a reset, or a
    step the wrappers take themselves (``gym.make``'s ``PassiveEnvChecker`` checks the first two, :attr:`checking`;
    a caller may call ``env.step``), leaves nothing for this object to catch up with.

    Observation (unbatched, ``H, W = screen_size[1], screen_size[0]``): ``[stack_size, H, W]`` (``[H, W]``
    without the stack; ``[..., 3]`` for RGB, ``[..., 1]`` with ``grayscale_newaxis``), ``uint8``, or ``float32`` in
    ``[0, 1]`` with ``scale_obs``; reward: the frames' rewards summed as ``AtariPreprocessing`` sums them (a float).
    """

    #: the inner frames whose screens are read, counted back from the last: into the second buffer, into the first
    SCREEN_READS = (2, 1)
    #: ``cv2``'s interpolation for the resize (``AtariPreprocessing``'s)
    INTERPOLATION = "INTER_AREA"

    def __init__(self, env: gym.Env, chain: Chain):
        import cv2

        self.env = env
        self._resize = cv2.resize
        self._interpolation = getattr(cv2, self.INTERPOLATION)
        self._chain = chain
        self._checking = True
        pre = chain.preprocessing
        atari = chain.atari
        self._pre = pre
        self._ale = atari.ale
        self._action_set = atari._action_set
        self._inner_frames = atari._frameskip
        self._frame_skip = pre.frame_skip
        #: the inner frames whose screens are read into the second and the first buffer
        self._screen_frames = tuple(pre.frame_skip - back for back in self.SCREEN_READS)
        self._screen_size = pre.screen_size
        self.life_loss = pre.terminal_on_life_loss
        self._read_screen = self._ale.getScreenGrayscale if pre.grayscale_obs else self._ale.getScreenRGB
        self._scale = pre.scale_obs
        frame_shape = pre.observation_space.shape
        self._frame_shape = frame_shape
        #: FrameStackObservation's own deque of the last stack_size frames (its reset refills it), or None
        self._queue = None if chain.stack is None else chain.stack.obs_queue
        self._observation_space = env.observation_space

    def __getattr__(self, name: str):
        """Anything else is the env's (its spaces, its ``np_random``, ...): this object stands in for it."""
        if name.startswith("__") or name in ("env", "_chain"):
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def checking(self) -> bool:
        """Whether a ``PassiveEnvChecker`` of the chain still checks its next step (its first two; once done, it
        never checks again)."""
        if self._checking:
            self._checking = not all(c.checked_step and c.checked_data_reuse for c in self._chain.checkers)
        return self._checking

    def step(self, action):
        """The chain's ``step(action)``, natively (through the wrappers while :attr:`checking`)."""
        if self.checking:
            return self.env.step(action)
        reward, terminated, truncated = self.emulate(action)
        frame = self.frame()
        if self._queue is None:
            obs = frame
        else:
            space = self._observation_space
            obs = np.empty(space.shape, space.dtype)
            self.stacked(frame, obs)
        ale = self._ale
        info = {"lives": ale.lives(), "episode_frame_number": ale.getEpisodeFrameNumber(),
                "frame_number": ale.getFrameNumber()}
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed=None, options=None):
        """The chain's ``reset`` (the wrappers' own)."""
        return self.env.reset(seed=seed, options=options)

    def emulate(self, action) -> tuple[float, bool, bool]:
        """``AtariPreprocessing.step``'s frames, natively: returns ``(reward, terminated, truncated)`` and leaves
        the last two frames' screens in the wrapper's buffers."""
        pre = self._pre
        ale = self._ale
        act = ale.act
        index = self._action_set[action]
        inner_frames = self._inner_frames
        time_limit = self._chain.time_limit
        buffers = pre.obs_buffer
        frame_skip = self._frame_skip
        second, first = self._screen_frames
        total_reward = 0.0
        terminated = False
        truncated = False
        for t in range(frame_skip):
            reward = 0.0
            for _ in range(inner_frames):
                reward += act(index, 1.0)
            terminated = ale.game_over(with_truncation=False)
            truncated = ale.game_truncated()
            if time_limit is not None:
                time_limit._elapsed_steps += 1
                if time_limit._elapsed_steps >= time_limit._max_episode_steps:
                    truncated = True
            total_reward += reward
            pre.game_over = terminated
            if self.life_loss:
                lives = ale.lives()
                terminated = terminated or lives < pre.lives
                pre.game_over = terminated
                pre.lives = lives
            if terminated or truncated:
                break
            if t == second:
                self._read_screen(buffers[1])
            elif t == first:
                self._read_screen(buffers[0])
        return total_reward, terminated, truncated

    def frame(self) -> np.ndarray:
        """``AtariPreprocessing._get_obs``: the max of its two buffers (in place, into the first, as it does),
        resized, scaled, with its channel axis."""
        buffers = self._pre.obs_buffer
        if self._frame_skip > 1:
            np.maximum(buffers[0], buffers[1], out=buffers[0])
        frame = self._resize(buffers[0], self._screen_size, interpolation=self._interpolation)
        if self._scale:
            frame = np.asarray(frame, dtype=np.float32) / 255.0
        return frame.reshape(self._frame_shape)

    def stacked(self, frame: np.ndarray, out: np.ndarray) -> None:
        """Write the observation whose newest frame is ``frame`` (a new array, kept by the stack) into ``out``:
        ``frame`` itself without a stack, else ``FrameStackObservation``'s step: ``frame`` joins its queue, and the
        queue, oldest first, is the observation."""
        if self._queue is None:
            out[...] = frame
            return
        self._queue.append(frame)
        self._write_stack(self._queue, out)

    @staticmethod
    def _write_stack(queue, out: np.ndarray) -> None:
        """``out[j]`` is the ``j``-th frame of ``queue``, oldest first."""
        for j, frame in enumerate(queue):
            out[j] = frame


class AtariStepper(GymStepper):
    """One covered chain stepped natively (:class:`AtariFrames`) into its buffer rows: ``"observation"`` (see
    :class:`AtariFrames`), ``"reward"`` ``float32 [1]``, ``"done"`` / ``"terminated"`` / ``"truncated"`` ``bool
    [1]``."""

    def __init__(self, env: gym.Env, chain: Chain):
        super().__init__(env)
        self.frames = AtariFrames(env, chain)

    def bind(self, views, index: int) -> None:
        super().bind(views, index)
        self.write_observations_to(views.next_np["observation"], views.root_np["observation"])

    def write_observations_to(self, next_obs: np.ndarray, root_obs: np.ndarray) -> None:
        """Where the next steps write their observation (row ``i`` of each): the buffers' rows, or a rollout's
        columns (see :class:`AtariBlockStepper`)."""
        self._next_obs = next_obs
        self._root_obs = root_obs

    def step(self) -> None:
        frames = self.frames
        i = self._i
        action = self._read_action(self._action, i)
        next_obs = self._next_obs
        if frames.checking:
            obs, reward, terminated, truncated, _ = self.env.step(action)
            self._write_checked(obs, next_obs, "step()")
        else:
            reward, terminated, truncated = frames.emulate(action)
            frames.stacked(frames.frame(), next_obs[i])
        if self._write_outcome(reward, terminated, truncated):
            obs, _ = self.autoreset()
            self._write_checked(obs, self._root_obs, "reset()")
        else:
            self._root_obs[i] = next_obs[i]

    def _write_checked(self, obs, rows: np.ndarray, call: str) -> None:
        try:
            self._write_obs(obs, {"observation": rows}, self._i)
        except (Mismatch, BadValue) as bad:
            raise self._error(bad, call) from None


def _covered(env) -> Chain | None:
    """The chain of ``env`` when the native road covers it; else None. A chain holding an ``AtariPreprocessing`` is
    marked with its road (``env.roads()`` reads it; logged at debug level)."""
    chain, reason = chain_of(env)
    if chain is None and reason is None:
        return None
    road = NATIVE if reason is None else f"{WRAPPERS_STEP}: {reason}"
    object.__setattr__(env, ROAD_ATTRIBUTE, road)
    _LOG.debug("%r takes the road %s", env, road)
    return chain


def native_stepper(env) -> AtariStepper | None:
    """The native stepper of a covered chain; None for any other env (the gymnasium family steps it)."""
    chain = _covered(env)
    return None if chain is None else AtariStepper(env, chain)


def native_env(env) -> AtariFrames | None:
    """For the faces that call an env's own ``step`` and ``reset`` (the vector faces' worker side): an object whose
    ``step`` / ``reset`` give what ``env``'s give, natively, for a covered chain; None for any other env."""
    chain = _covered(env)
    return None if chain is None else AtariFrames(env, chain)


class AtariBlockStepper:
    """A group's ``k`` native Atari envs as one block (:class:`~..engine.stepper.BlockStepper`): each steps as its
    :class:`AtariStepper` does, and a rollout recorded in the worker has them write their observations straight
    into its columns (no copy from the buffers)."""

    observation_key = "observation"

    def __init__(self, steppers: list, views):
        self._steppers = steppers
        self.envs = [s.env for s in steppers]
        #: the observation rows of the buffers ("next", root)
        self.buffer_observations = (views.next_np["observation"], views.root_np["observation"])

    def write_observations_to(self, next_obs: np.ndarray, root_obs: np.ndarray) -> None:
        for stepper in self._steppers:
            stepper.write_observations_to(next_obs, root_obs)

    def step(self) -> None:
        for stepper in self._steppers:
            stepper.step()


def block_stepper(steppers: list, views) -> AtariBlockStepper | None:
    """An :class:`AtariBlockStepper` when every env of the group is a native Atari env; else None."""
    if steppers and all(type(s) is AtariStepper for s in steppers):
        return AtariBlockStepper(steppers, views)
    return None


FAMILY = Family(name="gymnasium Atari preprocessing", priority=5, stepper=native_stepper, block=block_stepper,
                native_env=native_env)
