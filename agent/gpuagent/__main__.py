"""`python -m gpuagent`."""

import sys

from gpuagent.cli import main

sys.exit(main())
