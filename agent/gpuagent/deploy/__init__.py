"""Generators for the deployment files under deploy/ that are derived from others."""
