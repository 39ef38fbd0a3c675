"""python -m tokenmill.server [MODEL] [flags]: same as `tokenmill serve` (tcmalloc preloaded the same way)."""
import sys

from tokenmill.malloc import reexec_with_tcmalloc

reexec_with_tcmalloc("serve")

from tokenmill.server.launch import main  # noqa: E402

sys.exit(main())
