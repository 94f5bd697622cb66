"""Sources observe the node; they never decide health."""
