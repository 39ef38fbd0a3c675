"""The machine's price per hour that cost is computed from: `--price-per-hour` if given, else the
price a tokenmill server exports on /metrics (`tokenmill:price_per_hour_usd`, set by the server's
own `--price-per-hour`), else none, and then the report says that cost was not computed and why."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PRICE_SERIES = "tokenmill:price_per_hour_usd"
NO_COST = "cost not computed: pass --price-per-hour"

SOURCES = {"flag": "--price-per-hour", "server": f"the server's {PRICE_SERIES}"}


@dataclass(frozen=True)
class PriceChoice:
    per_hour: float | None
    source: str  # "flag", "server" or "none"
    note: str = ""  # with no price: why, and what to do

    def describe(self) -> str:
        if self.per_hour is None:
            return self.note
        return describe_price({"price_per_hour": self.per_hour, "price_source": self.source})

    def annotate(self, summary: dict[str, Any]) -> None:
        """Record in a run's summary where its price came from, or why there is no cost."""
        if summary.get("cost"):
            summary["cost"]["price_source"] = self.source
        else:
            summary["cost_note"] = self.note


def server_price(metrics_text: str | None) -> float | None:
    """`tokenmill:price_per_hour_usd` from a Prometheus exposition, or None."""
    if not metrics_text:
        return None
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(metrics_text):
            for s in family.samples:
                if s.name == PRICE_SERIES and math.isfinite(s.value) and s.value >= 0:
                    return float(s.value)
    except (ValueError, TypeError):
        return None
    return None


def choose_price(flag: float | None, metrics_text: str | None, base_url: str) -> PriceChoice:
    if flag is not None:
        return PriceChoice(flag, "flag")
    price = server_price(metrics_text)
    if price is not None:
        return PriceChoice(price, "server")
    metrics_url = base_url.rstrip("/") + "/metrics"
    why = (f"{metrics_url} has no {PRICE_SERIES}: not a tokenmill server?" if metrics_text
           else f"no {metrics_url} to read {PRICE_SERIES} from")
    return PriceChoice(None, "none", f"{NO_COST} ({why})")


def describe_price(record: dict[str, Any]) -> str:
    """The price of a summary's cost or a run's meta (its price_per_hour and price_source), e.g.
    "$1/h from --price-per-hour"."""
    where = SOURCES.get(record.get("price_source") or "")
    return f"${record['price_per_hour']:g}/h" + (f" from {where}" if where else "")
