"""The main process' side of the hand-off with its workers (see "Waiting" and "Re-placing after a pause" in
``protocol.py``): the wait both sides read, the flags saying who blocks, the doorbell the workers ring while the
main process blocks, and the re-placing of the workers after a pause. :class:`~.pool.WorkerPool` owns one.

Shared with the workers (each :class:`~.protocol.WorkerChannel` is given them):

- ``spin`` (float64 ``[1]``): the seconds both sides poll before they block, read by each worker after every
  command; the chosen value, or 0 while the workers are re-placed;
- ``blocked`` (int32 ``[1 + num_workers]``): ``[0]`` the main process blocks on the doorbell, ``[1 + w]`` worker
  ``w`` blocks for its next command;
- the doorbell's write end.
"""
from __future__ import annotations

import multiprocessing.connection
import time

import torch

from .protocol import REPLACING_COMMANDS
from .shared import in_shared_memory


class HandOff:
    """The shared wait, the flags and the doorbell of ``num_workers`` workers (see the module docstring)."""

    def __init__(self, context, num_workers: int, spin_s: float):
        #: the seconds chosen by the user (or the default): ``spin`` holds them but while the workers are re-placed
        self.chosen_spin_s = spin_s
        self.spin_tensor = in_shared_memory(torch.full((1,), spin_s, dtype=torch.float64), "the wait")
        self.spin = self.spin_tensor.numpy()
        self.blocked_tensor = in_shared_memory(torch.zeros(1 + num_workers, dtype=torch.int32), "who blocks")
        self.blocked = self.blocked_tensor.numpy()
        self.doorbell, self.doorbell_writer = context.Pipe(duplex=False)
        self.replacing = 0  # commands left to hand off by blocking

    def choose_spin(self, seconds: float) -> None:
        """Poll ``seconds`` from now on (from the end of the re-placing, if one is under way)."""
        self.chosen_spin_s = seconds
        if not self.replacing:
            self.spin[0] = seconds

    def before_command(self, workers) -> None:
        """Called for every synchronous command before it is sent: when one of ``workers`` blocks for it, this and the
        next ``REPLACING_COMMANDS - 1`` commands are handed off by blocking on both sides (the shared wait is 0 for
        them), so that the scheduler places the processes afresh; the last of them turns polling back on (the
        workers read the wait after each command). See "Re-placing after a pause" in ``protocol.py``."""
        if self.replacing:
            self.replacing -= 1
            if not self.replacing:
                self.spin[0] = self.chosen_spin_s
            return
        if self.chosen_spin_s <= 0:
            return
        blocked = self.blocked
        if any(blocked[1 + w] for w in workers):
            self.replacing = REPLACING_COMMANDS - 1
            self.spin[0] = 0.0

    def block(self, semaphore, sentinels: list, timeout: float) -> bool:
        """Block until ``semaphore`` is acquired (True), or until one of ``sentinels`` (the workers waited for) is
        ready or ``timeout`` seconds pass (False: the caller checks them), on the doorbell and the sentinels: never a
        timed semaphore wait."""
        doorbell = self.doorbell
        blocked = self.blocked
        until = time.monotonic() + timeout
        blocked[0] = 1
        try:
            while not semaphore.acquire(False):  # (after the flag: a worker done since then rings)
                left = until - time.monotonic()
                if left <= 0:
                    return False
                ready = multiprocessing.connection.wait([doorbell, *sentinels], left)
                if doorbell not in ready:  # a worker died, or the time is up
                    return semaphore.acquire(False)
                while doorbell.poll():
                    doorbell.recv_bytes()
            return True
        finally:
            blocked[0] = 0

    def close(self) -> None:
        """Close the doorbell (a block racing this from another thread ends with the closed error) and keep private
        copies of the shared arrays: their segments are freed once the workers are gone, and a call racing the
        close still finds arrays."""
        self.doorbell_writer.close()
        self.doorbell.close()
        self.spin = self.spin.copy()
        self.blocked = self.blocked.copy()
        self.spin_tensor = self.blocked_tensor = None
