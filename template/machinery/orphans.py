"""No orphans: a child process of the run dies with the process that started it.

run.py's train.py and predict.py, train.py's fold workers and tune.py's workers (workers.py), and
DataLoader workers (images.py) each call `die_with_parent` as they start. It is machinery: `copier
update` may replace it.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # linux/prctl.h

try:  # looked up here, in the parent: a child of a threaded process should not dlopen between fork and exec
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no parent-death signal
    _prctl = None


def die_with_parent(parent: int | None, sig: int = signal.SIGTERM) -> None:
    """In a child: `sig` to this process the moment the thread that started it ends, even by
    SIGKILL (Linux's parent-death signal), and at once when `parent` (the pid that started it)
    has already gone. Without that check a parent killed between the fork and this call left its
    child running for good: a DataLoader worker, asleep with the run's stdout open, hung a test
    that read it for 12 minutes, as torch's own check took the orphan's new parent (init) for its
    own. SIGTERM lets a train.py save and end; SIGKILL suits a loader worker, which has nothing
    to save. Elsewhere than Linux: nothing (DataLoader's 5 s check still stops its workers)."""
    if _prctl is None:
        return
    if sig != signal.SIGKILL and callable(signal.getsignal(sig)):
        # the starter's Python handler, copied by the fork: before exec it would run here, in the child, and
        # keep it alive (a fold worker of train.py, whose SIGTERM handler only asks for a stop). A blocked
        # signal (run.py's train.py holds SIGTERM) stays pending through exec, for the new program's handler.
        signal.signal(sig, signal.SIG_DFL)
    _prctl(PR_SET_PDEATHSIG, sig)
    if parent is not None and os.getppid() != parent:  # it died before the prctl: no signal will come
        os.kill(os.getpid(), sig)
