#!/bin/sh
# The fleet aggregator, from the same private virtualenv as the agent (see gpuagent.sh).
exec /usr/lib/gpuagent/bin/python3 -I -m gpuagent.aggregator "$@"
