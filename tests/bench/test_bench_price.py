"""The price cost is computed from: flag, else the server's tokenmill:price_per_hour_usd, else none."""

from __future__ import annotations

from prometheus_client import generate_latest

from tokenmill.bench.price import PRICE_SERIES, choose_price, server_price
from tokenmill.metrics.prometheus import PrometheusStatLogger

URL = "http://127.0.0.1:9"


def exposition(price: float) -> str:
    """What our server's /metrics says when started with --price-per-hour `price`."""
    return generate_latest(PrometheusStatLogger("m", price_per_hour=price).registry).decode()


def test_reads_the_price_our_server_exports() -> None:
    assert PRICE_SERIES in exposition(3.25)
    assert server_price(exposition(3.25)) == 3.25
    assert server_price(exposition(0.0)) == 0.0


def test_flag_wins_over_the_server() -> None:
    choice = choose_price(2.0, exposition(3.25), URL)
    assert (choice.per_hour, choice.source) == (2.0, "flag")
    assert choice.describe() == "$2/h from --price-per-hour"


def test_server_price_when_no_flag() -> None:
    choice = choose_price(None, exposition(3.25), URL)
    assert (choice.per_hour, choice.source) == (3.25, "server")
    assert choice.describe() == f"$3.25/h from the server's {PRICE_SERIES}"
    summary: dict = {"cost": {"price_per_hour": 3.25}}
    choice.annotate(summary)
    assert summary["cost"]["price_source"] == "server" and "cost_note" not in summary


def test_no_price_says_why_and_what_to_do() -> None:
    other = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
    for text, why in ((other, f"{URL}/metrics has no {PRICE_SERIES}"), (None, f"no {URL}/metrics")):
        choice = choose_price(None, text, URL)
        assert (choice.per_hour, choice.source) == (None, "none")
        assert choice.note.startswith("cost not computed: pass --price-per-hour (") and why in choice.note
        summary: dict = {"cost": None}
        choice.annotate(summary)
        assert summary["cost_note"] == choice.note
    assert server_price("not prometheus {{{") is None
