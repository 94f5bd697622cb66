"""The Kubernetes GPU stack as the node sees it: the device plugin, the container
toolkit's CDI specs and runtime, and the Node's advertised GPUs (see docs/checks.md,
check `kubernetes`)."""
