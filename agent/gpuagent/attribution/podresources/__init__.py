"""The kubelet's pod-resources v1 API: api.proto and the stubs grpcio-tools generated from it."""
