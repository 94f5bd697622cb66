"""Guarded remediation: a pure planner, cordon backends, and an executor with
preconditions, budgets that survive restarts, an audit trail and undo."""
