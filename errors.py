"""The one exception type users see: the CLI prints its message as one line and exits non-zero.

Also how a command over many dispatches skips one that fails (`skip_dispatch_on_error`).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager


class DispatchTuneError(Exception):
    """A user-facing error (bad input, unknown target, corrupt log, ...).

    The message must be one line that says what is wrong and, where possible, what to do.
    """


class InputError(DispatchTuneError):
    """The input file is missing, malformed, or has nothing dispatchtune can tune."""


class NoTunableOp(InputError):
    """The input holds no root op dispatchtune tunes (only elementwise ops, fills, copies, ...).

    Common and harmless for one dispatch of a model or of a dump directory, which is skipped.
    """


class TargetError(DispatchTuneError):
    """An unknown target name or a target this operation does not support."""


class UnsupportedProblem(InputError):
    """A root op IREE cannot be given a CPU configuration for (or one dispatchtune cannot model).

    Raised by enumeration before anything is compiled, with one line naming the limit, so a
    whole-model run can skip the dispatch and report why.
    """


class StorageLost(DispatchTuneError):
    """A study's database cannot be opened or failed mid-run (connection lost, timeout).

    It ends the whole run (no dispatch can go on without it); the run is resumable.
    """


@contextmanager
def skip_dispatch_on_error(
    key: str,
    skipped: MutableMapping[str, str],
    fatal: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:
    """Run one dispatch's step of a command over many; a `DispatchTuneError` skips that dispatch.

    One dispatch that cannot be handled (an op the search does not cover, a default build that
    fails) must not throw away the others' work: its one-line reason is stored in
    `skipped[key]` and the command goes on. `fatal` errors (something every later dispatch needs,
    such as an unreachable device host) still end the command. The caller says what was skipped.
    """
    try:
        yield
    except fatal:
        raise
    except DispatchTuneError as exc:
        skipped[key] = str(exc)
