# Stand-in for DCGM's Python bindings: dcgm_fields_internal.py (needed by dcgm_field_helpers).
# API followed: DCGM 4.5. Not the real DCGM.
DCGM_FI_DEV_COMPUTE_PIDS = 210
DCGM_FI_DEV_GRAPHICS_PIDS = 211
