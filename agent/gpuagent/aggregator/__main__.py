"""`python -m gpuagent.aggregator`: the same as the gpuagent-aggregator command."""

import sys

from gpuagent.aggregator.cli import main

sys.exit(main())
