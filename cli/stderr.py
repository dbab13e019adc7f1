"""Messages on stderr: warnings raised while a command runs become one line each."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def one_line_warnings(prog: str = "dispatchtune") -> Iterator[None]:
    """Show each warning as `prog: <label>: message` (no source line, no file path)."""
    from dispatchtune.datasets.records import CorruptRecordWarning

    def show(message: Any, category: type[Warning], *rest: Any, **kwargs: Any) -> None:
        label = "warning" if issubclass(category, CorruptRecordWarning) else category.__name__
        print(f"{prog}: {label}: {message}", file=sys.stderr)

    previous = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous
