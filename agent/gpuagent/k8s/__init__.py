"""Kubernetes as the node sees it: the GPU stack (the device plugin, the container
toolkit's CDI specs and runtime, the Node's advertised GPUs; docs/checks.md, check
`kubernetes`), and the Node's conditions and events the agent writes (docs/kubernetes.md)."""
