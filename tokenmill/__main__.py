import sys

from tokenmill.cli import main

sys.exit(main())
