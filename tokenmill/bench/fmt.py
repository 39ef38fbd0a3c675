"""Number and table formatting shared by the benchmark's reports, plots and comparisons."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return f"{v:,.{digits}f}" if abs(v) < 1e6 else f"{v:.3e}"
    return str(v)


def rate_label(rate: float | None) -> str:
    return "trace" if rate is None else fmt(float(rate), 2).rstrip("0").rstrip(".")


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return "\n".join(lines)
