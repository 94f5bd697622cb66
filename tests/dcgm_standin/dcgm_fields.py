# Stand-in for DCGM's Python bindings: dcgm_fields.py (Python mirror of dcgm_fields.h).
# API followed: DCGM 4.5. Field ids, types and entity groups are the real ones; the stand-in
# carries the subset of fields listed below (system, identity, clocks, power, utilization,
# XID, PCIe, ECC, retired pages, NVLink totals and the profiling fields). Not the real DCGM.
from ctypes import (
    POINTER,
    addressof,
    c_char,
    c_int,
    c_short,
    c_ubyte,
    c_uint,
    c_uint32,
    memmove,
    sizeof,
)

import dcgm_structs

dcgmFP = dcgm_structs._dcgmGetFunctionPointer

# Field types (one byte each)
DCGM_FT_BINARY = "b"
DCGM_FT_DOUBLE = "d"
DCGM_FT_INT64 = "i"
DCGM_FT_STRING = "s"
DCGM_FT_TIMESTAMP = "t"

# Field scope
DCGM_FS_GLOBAL = 0
DCGM_FS_ENTITY = 1
DCGM_FS_DEVICE = DCGM_FS_ENTITY

# Field entity groups
DCGM_FE_NONE = 0
DCGM_FE_GPU = 1
DCGM_FE_VGPU = 2
DCGM_FE_SWITCH = 3
DCGM_FE_GPU_I = 4
DCGM_FE_GPU_CI = 5
DCGM_FE_LINK = 6
DCGM_FE_CPU = 7
DCGM_FE_CPU_CORE = 8
DCGM_FE_CONNECTX = 9

c_dcgm_field_eid_t = c_uint32

# System
DCGM_FI_UNKNOWN = 0
DCGM_FI_DRIVER_VERSION = 1
DCGM_FI_NVML_VERSION = 2
DCGM_FI_PROCESS_NAME = 3
DCGM_FI_DEV_COUNT = 4
DCGM_FI_CUDA_DRIVER_VERSION = 5
# Device identity
DCGM_FI_DEV_NAME = 50
DCGM_FI_DEV_BRAND = 51
DCGM_FI_DEV_NVML_INDEX = 52
DCGM_FI_DEV_SERIAL = 53
DCGM_FI_DEV_UUID = 54
DCGM_FI_DEV_MINOR_NUMBER = 55
DCGM_FI_DEV_PCI_BUSID = 57
DCGM_FI_DEV_PCI_COMBINED_ID = 58
DCGM_FI_DEV_PCI_SUBSYS_ID = 59
DCGM_FI_DEV_VBIOS_VERSION = 85
# Clocks, temperature, power
DCGM_FI_DEV_SM_CLOCK = 100
DCGM_FI_DEV_MEM_CLOCK = 101
DCGM_FI_DEV_VIDEO_CLOCK = 102
DCGM_FI_DEV_APP_SM_CLOCK = 110
DCGM_FI_DEV_APP_MEM_CLOCK = 111
DCGM_FI_DEV_CLOCKS_EVENT_REASONS = 112
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS = DCGM_FI_DEV_CLOCKS_EVENT_REASONS
DCGM_FI_DEV_MEMORY_TEMP = 140
DCGM_FI_DEV_GPU_TEMP = 150
DCGM_FI_DEV_POWER_USAGE = 155
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 156
DCGM_FI_DEV_POWER_USAGE_INSTANT = 157
DCGM_FI_DEV_POWER_MGMT_LIMIT = 160
DCGM_FI_DEV_ENFORCED_POWER_LIMIT = 164
DCGM_FI_DEV_PSTATE = 190
DCGM_FI_DEV_FAN_SPEED = 191
# Utilization
DCGM_FI_DEV_PCIE_TX_THROUGHPUT = 200
DCGM_FI_DEV_PCIE_RX_THROUGHPUT = 201
DCGM_FI_DEV_PCIE_REPLAY_COUNTER = 202
DCGM_FI_DEV_GPU_UTIL = 203
DCGM_FI_DEV_MEM_COPY_UTIL = 204
DCGM_FI_DEV_ACCOUNTING_DATA = 205
DCGM_FI_DEV_ENC_UTIL = 206
DCGM_FI_DEV_DEC_UTIL = 207
DCGM_FI_DEV_XID_ERRORS = 230
DCGM_FI_DEV_PCIE_MAX_LINK_GEN = 235
DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH = 236
DCGM_FI_DEV_PCIE_LINK_GEN = 237
DCGM_FI_DEV_PCIE_LINK_WIDTH = 238
DCGM_FI_DEV_POWER_VIOLATION = 240
DCGM_FI_DEV_THERMAL_VIOLATION = 241
DCGM_FI_DEV_SYNC_BOOST_VIOLATION = 242
DCGM_FI_DEV_BOARD_LIMIT_VIOLATION = 243
DCGM_FI_DEV_LOW_UTIL_VIOLATION = 244
DCGM_FI_DEV_RELIABILITY_VIOLATION = 245
DCGM_FI_DEV_FB_TOTAL = 250
DCGM_FI_DEV_FB_FREE = 251
DCGM_FI_DEV_FB_USED = 252
DCGM_FI_DEV_FB_RESERVED = 253
DCGM_FI_SYNC_BOOST = 91
# ECC
DCGM_FI_DEV_ECC_CURRENT = 300
DCGM_FI_DEV_ECC_PENDING = 301
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL = 310
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL = 311
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL = 312
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL = 313
# Retired pages and row remapping
DCGM_FI_DEV_RETIRED_SBE = 390
DCGM_FI_DEV_RETIRED_DBE = 391
DCGM_FI_DEV_RETIRED_PENDING = 392
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS = 393
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS = 394
DCGM_FI_DEV_ROW_REMAP_FAILURE = 395
DCGM_FI_DEV_ROW_REMAP_PENDING = 396
# NVLink totals
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 409
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 419
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 429
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 439
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL = 449
DCGM_FI_DEV_GPU_NVLINK_ERRORS = 450
# Profiling
DCGM_FI_PROF_GR_ENGINE_ACTIVE = 1001
DCGM_FI_PROF_SM_ACTIVE = 1002
DCGM_FI_PROF_SM_OCCUPANCY = 1003
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE = 1004
DCGM_FI_PROF_DRAM_ACTIVE = 1005
DCGM_FI_PROF_PIPE_FP64_ACTIVE = 1006
DCGM_FI_PROF_PIPE_FP32_ACTIVE = 1007
DCGM_FI_PROF_PIPE_FP16_ACTIVE = 1008
DCGM_FI_PROF_PCIE_TX_BYTES = 1009
DCGM_FI_PROF_PCIE_RX_BYTES = 1010
DCGM_FI_PROF_NVLINK_TX_BYTES = 1011
DCGM_FI_PROF_NVLINK_RX_BYTES = 1012
DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE = 1013
DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE = 1014
DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE = 1015
DCGM_FI_PROF_PIPE_INT_ACTIVE = 1016
DCGM_FI_PROF_NVDEC0_ACTIVE = 1017
DCGM_FI_PROF_NVDEC1_ACTIVE = 1018
DCGM_FI_PROF_NVDEC2_ACTIVE = 1019
DCGM_FI_PROF_NVDEC3_ACTIVE = 1020
DCGM_FI_PROF_NVDEC4_ACTIVE = 1021
DCGM_FI_PROF_NVDEC5_ACTIVE = 1022
DCGM_FI_PROF_NVDEC6_ACTIVE = 1023
DCGM_FI_PROF_NVDEC7_ACTIVE = 1024
DCGM_FI_PROF_NVJPG0_ACTIVE = 1025
DCGM_FI_PROF_NVJPG1_ACTIVE = 1026
DCGM_FI_PROF_NVJPG2_ACTIVE = 1027
DCGM_FI_PROF_NVJPG3_ACTIVE = 1028
DCGM_FI_PROF_NVJPG4_ACTIVE = 1029
DCGM_FI_PROF_NVJPG5_ACTIVE = 1030
DCGM_FI_PROF_NVJPG6_ACTIVE = 1031
DCGM_FI_PROF_NVJPG7_ACTIVE = 1032
DCGM_FI_PROF_NVOFA0_ACTIVE = 1033
DCGM_FI_PROF_NVOFA1_ACTIVE = 1034
DCGM_FI_PROF_NVLINK_L0_TX_BYTES = 1040
DCGM_FI_PROF_NVLINK_L0_RX_BYTES = 1041
DCGM_FI_PROF_NVLINK_THROUGHPUT_FIRST = DCGM_FI_PROF_NVLINK_L0_TX_BYTES
DCGM_FI_PROF_NVLINK_THROUGHPUT_LAST = 1075
DCGM_FI_PROF_C2C_TX_ALL_BYTES = 1076
DCGM_FI_PROF_C2C_TX_DATA_BYTES = 1077
DCGM_FI_PROF_C2C_RX_ALL_BYTES = 1078
DCGM_FI_PROF_C2C_RX_DATA_BYTES = 1079
DCGM_FI_PROF_HOSTMEM_CACHE_HIT = 1080
DCGM_FI_PROF_HOSTMEM_CACHE_MISS = 1081
DCGM_FI_PROF_PEERMEM_CACHE_HIT = 1082
DCGM_FI_PROF_PEERMEM_CACHE_MISS = 1083

DCGM_FI_IMEX_DAEMON_STATUS = 1503
DCGM_FI_MAX_FIELDS = DCGM_FI_IMEX_DAEMON_STATUS + 1


class struct_c_dcgm_field_meta_t(dcgm_structs._DcgmStructure):
    pass  # opaque handle


dcgm_field_meta_t = POINTER(struct_c_dcgm_field_meta_t)


class _PrintableStructure(dcgm_structs._DcgmStructure):
    _fmt_ = {}

    def __str__(self):
        parts = []
        for name, _type in self._fields_:
            fmt = self._fmt_.get(name, self._fmt_.get("<default>", "%s"))
            parts.append(("%s: " + fmt) % (name, getattr(self, name)))
        return self.__class__.__name__ + "(" + ", ".join(parts) + ")"


SHORTNAME_LENGTH = 10
UNIT_LENGTH = 4


class c_dcgm_field_output_format_t(_PrintableStructure):
    _fields_ = [
        ("shortName", c_char * SHORTNAME_LENGTH),
        ("unit", c_char * UNIT_LENGTH),
        ("width", c_short),
    ]


dcgm_field_output_format_t = POINTER(c_dcgm_field_output_format_t)

TAG_LENGTH = 48


class c_dcgm_field_meta_t(_PrintableStructure):
    _fields_ = [
        ("fieldId", c_short),
        ("fieldType", c_char),
        ("size", c_ubyte),
        ("tag", c_char * TAG_LENGTH),
        ("scope", c_int),
        ("nvmlFieldId", c_int),
        ("entityLevel", c_uint),
        ("valueFormat", dcgm_field_output_format_t),
    ]


def DcgmFieldsInit():
    fn = dcgmFP("DcgmFieldsInit")
    ret = fn()
    assert ret == 0, "Got return %d from DcgmFieldsInit" % ret


def _copy_meta(ptr):
    if not ptr:
        return None
    meta = c_dcgm_field_meta_t()
    memmove(addressof(meta), ptr, sizeof(meta))
    return meta


def DcgmFieldGetById(fieldId):
    """Metadata (c_dcgm_field_meta_t) of a field id, or None."""
    DcgmFieldsInit()
    fn = dcgmFP("DcgmFieldGetById")
    fn.restype = POINTER(c_dcgm_field_meta_t)
    return _copy_meta(fn(fieldId))


def DcgmFieldGetByTag(tag):
    """Metadata (c_dcgm_field_meta_t) of a field tag such as 'gpu_temp', or None."""
    DcgmFieldsInit()
    fn = dcgmFP("DcgmFieldGetByTag")
    fn.restype = POINTER(c_dcgm_field_meta_t)
    return _copy_meta(fn(tag.encode("utf-8")))


def DcgmFieldGetTagById(fieldId):
    field = DcgmFieldGetById(fieldId)
    return field.tag if field else None


def DcgmFieldGetIdByTag(fieldTag):
    field = DcgmFieldGetByTag(fieldTag)
    return field.fieldId if field else None
