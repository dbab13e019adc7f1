"""The one exception type users see: the CLI prints its message as one line and exits non-zero."""

from __future__ import annotations


class DispatchTuneError(Exception):
    """A user-facing error (bad input, unknown target, corrupt log, ...).

    The message must be one line that says what is wrong and, where possible, what to do.
    """


class InputError(DispatchTuneError):
    """The input file is missing, malformed, or has nothing dispatchtune can tune."""


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
