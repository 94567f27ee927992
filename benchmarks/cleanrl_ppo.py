"""CleanRL-style PPO training loops (Breakout, CartPole), timed end to end, with the vector env as the only change.

The loop a CleanRL user runs (one file, top to bottom): ``envs = <vector env>(8 envs)``, then per update 128 steps
of ``envs.step(actions)`` with the policy, GAE, and 4 epochs of 4 clipped-PPO minibatches. Only the vector env
differs between the systems:

* ``sync``  - ``gymnasium.vector.SyncVectorEnv`` (one process);
* ``async`` - ``gymnasium.vector.AsyncVectorEnv`` (a process per env);
* ``ours``  - ``tdcollect.envs.vector.ParallelVectorEnv`` (its default split of the envs over worker processes).

Steps/s = env steps of the timed updates over their wall time (policy, env and learning all counted), after one
warm-up update; every system runs once per round, rounds interleaved; medians reported, with the share of the
time spent in ``envs.step``.

    python -m benchmarks.cleanrl_ppo --env breakout --rounds 3 --updates 2 [--json out.json]
    python -m benchmarks.cleanrl_ppo --env cartpole

``breakout``: ``ALE/Breakout-v5`` without its own frame skip, through gymnasium's ``AtariPreprocessing`` (frame
skip 4, no-op starts, 84x84 grayscale, episode end on life loss), reward sign, and a stack of the last 4 frames
(uint8 ``[4, 84, 84]``), with the Nature-DQN network. ``cartpole``: ``CartPole-v1`` with two 64-unit tanh MLPs.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

SETTINGS = dict(num_envs=8, num_steps=128, epochs=4, minibatches=4, lr=2.5e-4, gamma=0.99, lam=0.95, clip=0.1,
                entropy=0.01, value=0.5, max_grad_norm=0.5)


def make_breakout(seed: int) -> gym.Env:
    """One preprocessed Breakout env (see the module docstring); observations uint8 ``[4, 84, 84]``."""
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, noop_max=30, screen_size=84,
                                          terminal_on_life_loss=True, grayscale_obs=True)
    env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))
    env = gym.wrappers.FrameStackObservation(env, 4)
    env.action_space.seed(seed)
    return env


def make_cartpole(seed: int) -> gym.Env:
    env = gym.make("CartPole-v1")
    env.action_space.seed(seed)
    return env


ENVS = {"breakout": make_breakout, "cartpole": make_cartpole}


def vector_env(system: str, env_name: str, seed: int):
    fns = [functools.partial(ENVS[env_name], seed + i) for i in range(SETTINGS["num_envs"])]
    if system == "sync":
        return gym.vector.SyncVectorEnv(fns)
    if system == "async":
        return gym.vector.AsyncVectorEnv(fns)
    from tdcollect.envs.vector import ParallelVectorEnv

    return ParallelVectorEnv(fns)


class Agent(nn.Module):
    """A policy head and a value head on a shared trunk: the Nature-DQN convolutions for uint8 frames
    ``[B, 4, 84, 84]`` (scaled to [0, 1]), else a 64-unit tanh MLP for float vectors ``[B, d]``."""

    def __init__(self, obs_shape: tuple, actions: int):
        super().__init__()
        self.pixels = len(obs_shape) == 3
        if self.pixels:
            self.trunk = nn.Sequential(
                nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU())
            width = 512
        else:
            self.trunk = nn.Sequential(nn.Linear(obs_shape[0], 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
            width = 64
        self.policy, self.value = nn.Linear(width, actions), nn.Linear(width, 1)

    def forward(self, obs: torch.Tensor):
        """``obs`` ``[B, *obs_shape]`` -> (logits ``[B, actions]``, value ``[B]``)."""
        hidden = self.trunk(obs.float() / 255.0 if self.pixels else obs.float())
        return self.policy(hidden), self.value(hidden).squeeze(-1)


def ppo_update(agent, optimizer, batch: dict) -> None:
    """4 epochs of clipped PPO over ``batch`` (flat ``[T * N]`` tensors: obs, actions, logp, advantages, returns)."""
    s = SETTINGS
    size = batch["obs"].shape[0]
    for _ in range(s["epochs"]):
        for index in torch.randperm(size).chunk(s["minibatches"]):
            logits, value = agent(batch["obs"][index])
            dist = torch.distributions.Categorical(logits=logits)
            ratio = (dist.log_prob(batch["actions"][index]) - batch["logp"][index]).exp()
            adv = batch["advantages"][index]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - s["clip"], 1 + s["clip"])).mean()
            value_loss = 0.5 * (value - batch["returns"][index]).pow(2).mean()
            loss = policy_loss - s["entropy"] * dist.entropy().mean() + s["value"] * value_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), s["max_grad_norm"])
            optimizer.step()


def advantages(rewards, dones, values, next_value, next_done):
    """GAE over ``[T, N]`` tensors (``dones[t]``: the env had ended before step ``t``); (advantages, returns)."""
    s = SETTINGS
    adv = torch.zeros_like(rewards)
    following_value, following_alive, last = next_value, 1.0 - next_done, torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + s["gamma"] * following_value * following_alive - values[t]
        last = adv[t] = delta + s["gamma"] * s["lam"] * following_alive * last
        following_value, following_alive = values[t], 1.0 - dones[t]
    return adv, adv + values


def train(system: str, env_name: str, updates: int, seed: int = 0) -> dict:
    """``updates + 1`` PPO updates (the first untimed); ``{"system", "steps_per_s", "seconds", "steps"}``."""
    s = SETTINGS
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    envs = vector_env(system, env_name, seed)
    try:
        obs_space = envs.single_observation_space
        agent = Agent(obs_space.shape, envs.single_action_space.n)
        optimizer = torch.optim.Adam(agent.parameters(), lr=s["lr"], eps=1e-5)
        T, N = s["num_steps"], s["num_envs"]
        obs_buf = torch.zeros((T, N, *obs_space.shape), dtype=torch.as_tensor(obs_space.sample()).dtype)
        actions, logps, rewards, dones, values = (torch.zeros((T, N)) for _ in range(5))
        obs, _ = envs.reset(seed=seed)
        next_obs, next_done = torch.as_tensor(obs), torch.zeros(N)
        start, env_seconds = None, 0.0
        for update in range(updates + 1):
            if update == 1:
                start, env_seconds = time.perf_counter(), 0.0
            for t in range(T):
                obs_buf[t], dones[t] = next_obs, next_done
                with torch.no_grad():
                    logits, values[t] = agent(next_obs)
                dist = torch.distributions.Categorical(logits=logits)
                actions[t] = dist.sample()
                logps[t] = dist.log_prob(actions[t])
                stepped = time.perf_counter()
                obs, reward, terminated, truncated, _ = envs.step(actions[t].long().numpy())
                env_seconds += time.perf_counter() - stepped
                rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
                next_obs = torch.as_tensor(obs)
                next_done = torch.as_tensor(np.logical_or(terminated, truncated), dtype=torch.float32)
            with torch.no_grad():
                next_value = agent(next_obs)[1]
            adv, returns = advantages(rewards, dones, values, next_value, next_done)
            ppo_update(agent, optimizer, {"obs": obs_buf.flatten(0, 1), "actions": actions.flatten(),
                                          "logp": logps.flatten(), "advantages": adv.flatten(),
                                          "returns": returns.flatten()})
        seconds = time.perf_counter() - start
    finally:
        envs.close()
    assert torch.get_num_threads() == threads, f"{system} changed this process' torch threads"
    steps = updates * T * N
    return {"system": system, "env": env_name, "steps_per_s": steps / seconds, "seconds": seconds, "steps": steps,
            "env_share": env_seconds / seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="CleanRL-style PPO, 8 envs: steps/s end to end")
    p.add_argument("--env", choices=list(ENVS), default="breakout")
    p.add_argument("--systems", nargs="+", choices=["sync", "async", "ours"], default=["sync", "async", "ours"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--updates", type=int, default=3, help="timed updates per run (after one warm-up update)")
    p.add_argument("--json", help="also write every run to this file")
    args = p.parse_args(argv)
    runs = []
    for r in range(args.rounds):
        for system in args.systems:
            result = {**train(system, args.env, args.updates, seed=r), "round": r}
            runs.append(result)
            print(f"round {r} {system:6s} {result['steps_per_s']:7.1f} steps/s, {result['env_share']:.0%} of the time "
                  "in envs.step", flush=True)
    base = statistics.median(x["steps_per_s"] for x in runs if x["system"] == args.systems[0])
    print(f"\n| system | steps/s (median of {args.rounds}) | vs {args.systems[0]} | time in envs.step |\n"
          "|---|---:|---:|---:|")
    for system in args.systems:
        mine = [x for x in runs if x["system"] == system]
        rate = statistics.median(x["steps_per_s"] for x in mine)
        share = statistics.median(x["env_share"] for x in mine)
        print(f"| {system} | {rate:,.0f} | {rate / base:.2f}x | {share:.0%} |")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"settings": SETTINGS, "torch_threads": torch.get_num_threads(), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
