"""Workload attribution: who each GPU belongs to.

Kubernetes: the kubelet's pod-resources API lists the devices allocated to each pod's
containers, by device plugin ID (the GPU's or MIG device's UUID). Slurm: each GPU process's
cgroup names the job it runs in. Both are read off the event loop; the per-GPU owners are
attached to the GPU states when a snapshot is published, so a scrape never reads anything.
"""
