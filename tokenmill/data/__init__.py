"""Small text assets shipped with tokenmill (public domain only; see README.md here)."""
from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).parent
ALICE = "alice_ch1_2.txt"


def read_text(name: str = ALICE) -> str:
    """A shipped text by file name; the default is Alice's Adventures in Wonderland, chapters I-II."""
    return (DATA_DIR / name).read_text(encoding="utf-8")
