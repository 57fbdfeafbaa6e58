"""Per-epoch metrics to a seed run, sent between epochs by a background thread.

Sending an epoch's metrics to the store costs tens of milliseconds (a sqlite transaction, or a
request to a server), as long as a whole epoch of the AMP variants on a fast GPU. ``on_epoch``
only queues them; a sender thread takes them to the store in order, while the loop evaluates.
The sender never works inside a timed epoch: ``hold()`` (the loop, before its clock starts) waits
for a send in flight and keeps the next one back until ``release()``. A send running beside the
timed steps took the interpreter from the loop (CPython hands it over only every 5 ms, and each
step gives it up several times): AMP epochs ran at ~230k instead of ~325k images/s on an H100.
Waiting for a send costs the study wall time (an sqlite commit took ~0.3 s per epoch on the H200
host, 60 epochs a stage), so the sender sends at most every ``SEND_EVERY_S`` seconds, every
epoch pending then in one go: the UI's curves lag by that much, and nothing is lost (pending
metrics are in every checkpoint). A failing store never stops training or a checkpoint: what it
has not taken stays pending (``state()`` goes into the checkpoint) and is sent later, by
``close()``, or by a re-run.
"""

from __future__ import annotations

import logging
import threading
import time

from ampbench.tracking import store

log = logging.getLogger(__name__)


SEND_EVERY_S = 10.0


class EpochHooks:
    def __init__(
        self,
        tracker,
        run_id: str,
        pending: list | None = None,
        background: bool = True,
        send_every_s: float = SEND_EVERY_S,
        held: set[int] | None = None,
    ) -> None:
        self.tracker, self.run_id, self.send_every_s = tracker, run_id, send_every_s
        self.held = set(held or ())  # epochs the run holds already (a resumed run's: not sent again)
        self._last_send = time.monotonic()
        self.pending: list = list(pending or [])
        self._lock = threading.Lock()  # guards `pending` between the loop and the sender
        self._wake = threading.Condition()
        self._closed = False
        self._held = False  # a timed epoch runs: no send may start (guarded by _wake)
        self._sending = False  # a send is in flight (guarded by _wake)
        self._parked = not background  # the sender waits on _wake, running nothing (guarded by _wake)
        self._sender = None
        self._refused = False  # the store's refusal was said; said again only after it took records
        if background:
            self._sender = threading.Thread(target=self._send_loop, daemon=True, name="epoch-metrics")
            self._sender.start()

    def on_epoch(self, epoch: int, metrics: dict) -> None:
        if epoch in self.held:  # trained again after a kill -9: the run has its first values
            return
        with self._lock:
            self.pending.append([epoch, dict(metrics)])
        if self._sender is None:
            self.flush(quiet=True)
            return
        self._wake_sender()

    def _wake_sender(self) -> None:
        """Let the sender look again; it counts as running until it parks again, so a hold()
        right after waits for that instead of seeing the flag of its last wait."""
        with self._wake:
            self._parked = self._sender is None  # no sender: nothing ever runs beside the loop
            self._wake.notify_all()

    def hold(self, timeout: float | None = None) -> bool:
        """A timed region begins: wait for a send in flight (at most ``timeout`` seconds), start
        none until ``release()``. False when a send is still in flight (a slow store)."""
        with self._wake:
            self._held = True
            # parked, not just idle: between two sends the sender still runs a few lines of Python
            return self._wake.wait_for(lambda: self._parked or self._closed, timeout)

    def release(self) -> None:
        """The timed region ended: pending metrics may go."""
        with self._wake:
            self._held = False
        self._wake_sender()

    def _send_loop(self) -> None:
        while True:
            with self._wake:
                # No timed wait: woken by on_epoch, release and close only (the loop's thread,
                # outside its clock), so this thread never runs while an epoch is timed.
                while not self._closed and (self._held or not self.state() or self._too_soon()):
                    self._parked = True
                    self._wake.notify_all()  # a hold() waiting for the sender to park
                    self._wake.wait()
                    self._parked = False
                closed, self._sending = self._closed, True
            try:
                sent = self.flush(quiet=True)
            finally:
                with self._wake:
                    self._sending, self._last_send = False, time.monotonic()
                    self._wake.notify_all()
            if not sent or closed:
                if closed:
                    return
                with self._wake:  # the store refused: try again with the next epoch's metrics
                    if not self._closed:  # set under this lock: close() cannot slip in between
                        self._parked = True
                        self._wake.notify_all()
                        self._wake.wait()
                        self._parked = False

    def _too_soon(self) -> bool:
        return time.monotonic() - self._last_send < self.send_every_s

    def close(self) -> bool:
        """Stop the sender after one last try; True when the store took everything."""
        if self._sender is not None:
            with self._wake:
                self._closed = True
                self._wake.notify_all()  # the sender, or a hold() waiting
            self._sender.join()
            self._sender = None
        return not self.state()

    def flush(self, quiet: bool = False) -> bool:
        """Send what is pending, oldest first; True when nothing is left. ``quiet``: warn, don't raise."""
        while True:
            with self._lock:
                if not self.pending:
                    return True
                epoch, metrics = self.pending[0]
            try:
                self.tracker.log_metrics(self.run_id, metrics, step=epoch)
            except Exception as err:
                if not quiet:
                    raise
                self._say_refused(err)
                return False
            with self._lock:
                self.pending.pop(0)
                left = len(self.pending)
            if self._refused and not left:
                self._refused = False
                log.info("MLflow store %s took run %s's epochs kept meanwhile", self.tracker.uri, self.run_id)

    def _say_refused(self, err: Exception) -> None:
        """Once while the store refuses (hostile pass WARN: "did not take epoch 1" after every epoch,
        naming the oldest pending epoch, not the one just trained)."""
        if self._refused:
            return
        self._refused = True
        with self._lock:
            epochs = [epoch for epoch, _ in self.pending]
        log.warning(
            "MLflow store %s did not take run %s's %s (%s); kept in the checkpoint with each later "
            "epoch, sent once it answers",
            self.tracker.uri,
            self.run_id,
            f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}-{epochs[-1]}",
            store.brief(err),
        )

    def state(self) -> list:
        with self._lock:
            return [list(p) for p in self.pending]
