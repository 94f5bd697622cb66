# Stand-in for DCGM's Python bindings: dcgmvalue.py.
# API followed: DCGM 4.5 (bindings/python3 of datacenter-gpu-manager-4). Not the real DCGM.
"""Blank-value sentinels and the DcgmValue helper, as in the real dcgmvalue module."""

DCGM_INT8_BLANK = 0x70
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0

# 2 ** 47: still exact when the small offsets below are added.
DCGM_FP64_BLANK = 140737488355328.0

DCGM_STR_BLANK = "<<<NULL>>>"

DCGM_INT32_NOT_FOUND = DCGM_INT32_BLANK + 1
DCGM_INT64_NOT_FOUND = DCGM_INT64_BLANK + 1
DCGM_FP64_NOT_FOUND = DCGM_FP64_BLANK + 1.0
DCGM_STR_NOT_FOUND = "<<<NOT_FOUND>>>"

DCGM_INT32_NOT_SUPPORTED = DCGM_INT32_BLANK + 2
DCGM_INT64_NOT_SUPPORTED = DCGM_INT64_BLANK + 2
DCGM_FP64_NOT_SUPPORTED = DCGM_FP64_BLANK + 2.0
DCGM_STR_NOT_SUPPORTED = "<<<NOT_SUPPORTED>>>"

DCGM_INT32_NOT_PERMISSIONED = DCGM_INT32_BLANK + 3
DCGM_INT64_NOT_PERMISSIONED = DCGM_INT64_BLANK + 3
DCGM_FP64_NOT_PERMISSIONED = DCGM_FP64_BLANK + 3.0
DCGM_STR_NOT_PERMISSIONED = "<<<NOT_PERM>>>"


def DCGM_INT8_IS_BLANK(val):
    return val >= DCGM_INT8_BLANK


def DCGM_INT32_IS_BLANK(val):
    return val >= DCGM_INT32_BLANK


def DCGM_INT64_IS_BLANK(val):
    return val >= DCGM_INT64_BLANK


def DCGM_FP64_IS_BLANK(val):
    return val >= DCGM_FP64_BLANK


def DCGM_STR_IS_BLANK(val):
    # A blank string starts with <<< and contains >>>.
    return val.startswith("<<<") and ">>>" in val


class DcgmValue:
    def __init__(self, value):
        self.value = value

    def SetFromInt32(self, i32Value):
        value = int(i32Value)
        if not DCGM_INT32_IS_BLANK(value):
            self.value = value
        elif value == DCGM_INT32_NOT_FOUND:
            self.value = DCGM_INT64_NOT_FOUND
        elif value == DCGM_INT32_NOT_SUPPORTED:
            self.value = DCGM_INT64_NOT_SUPPORTED
        elif value == DCGM_INT32_NOT_PERMISSIONED:
            self.value = DCGM_INT64_NOT_PERMISSIONED
        else:
            self.value = DCGM_INT64_BLANK

    def IsBlank(self):
        if self.value is None:
            return True
        if isinstance(self.value, int):
            return DCGM_INT64_IS_BLANK(self.value)
        if isinstance(self.value, float):
            return DCGM_FP64_IS_BLANK(self.value)
        if isinstance(self.value, str):
            return DCGM_STR_IS_BLANK(self.value)
        raise Exception("Unknown type: %s" % type(self.value))

    def __str__(self):
        return str(self.value)
