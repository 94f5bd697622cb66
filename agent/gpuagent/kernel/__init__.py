"""The kernel log: parsing NVIDIA driver and PCIe AER messages, and the XID catalog."""
