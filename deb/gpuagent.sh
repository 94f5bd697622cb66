#!/bin/sh
# gpuagent lives in a private virtualenv; -I: no PYTHON* variables, no user site, no
# current directory on sys.path.
exec /usr/lib/gpuagent/bin/python3 -I -m gpuagent "$@"
