"""python -m tokenmill.server [MODEL] [flags]: same as `tokenmill serve`."""
import sys

from tokenmill.server.launch import main

sys.exit(main())
