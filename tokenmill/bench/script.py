"""The entry point every benchmark module shares: its docstring as --help, its own flags, its run."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def run_script(doc: str | None, add_arguments: Callable[[argparse.ArgumentParser], None],
               run: Callable[[argparse.Namespace], int], argv: list[str] | None = None) -> int:
    main_spec = getattr(sys.modules["__main__"], "__spec__", None)
    if argv is None and main_spec is not None and main_spec.name.startswith("tokenmill.bench."):
        # `python -m tokenmill.bench.X`: on tcmalloc where installed, as `tokenmill bench X` is
        from tokenmill.malloc import reexec_with_tcmalloc
        reexec_with_tcmalloc("bench")
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


def write_record(path: str | None, **payload) -> None:
    """A benchmark's JSON record: the machine, the date and the command line, then its results."""
    if not path:
        return
    import json
    import time

    from tokenmill.bench.offline import machine
    with open(path, "w") as f:
        json.dump({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv, **payload}, f,
                  indent=2)
