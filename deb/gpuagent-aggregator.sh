#!/bin/sh
# The fleet aggregator lives in a private virtualenv of its own; -I: no PYTHON* variables,
# no user site, no current directory on sys.path.
exec /usr/lib/gpuagent-aggregator/bin/python3 -I -m gpuagent.aggregator "$@"
