# Stand-in for DCGM's Python bindings: DcgmLogging.py.
# API followed: DCGM 4.5. Not the real DCGM.
"""Logger categories (loggerCategory_t), as in the real DcgmLogging module."""

BASE_LOGGER = 0
SYSLOG_LOGGER = 1
CONSOLE_LOGGER = 2
FILE_LOGGER = 3
