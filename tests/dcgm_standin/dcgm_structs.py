# Stand-in for DCGM's Python bindings: dcgm_structs.py (Python mirror of dcgm_structs.h).
# API followed: DCGM 4.5 (bindings/python3 of datacenter-gpu-manager-4): the same names,
# constants, version numbers and ctypes layouts as the real module for everything the
# stand-in implements. The "library" behind it is the fake host engine in _standin_engine.
# Not the real DCGM.
import json
import string
import sys
import threading
from ctypes import (
    Array,
    Structure,
    Union,
    c_bool,
    c_byte,
    c_char,
    c_double,
    c_int,
    c_int32,
    c_int64,
    c_longlong,
    c_short,
    c_ubyte,
    c_uint,
    c_uint16,
    c_uint32,
    c_uint64,
    c_ushort,
    c_void_p,
    sizeof,
)
from inspect import isclass

import dcgmvalue

DCGM_MAX_STR_LENGTH = 256
DCGM_MAX_NUM_DEVICES = 32
DCGM_MAX_NUM_SWITCHES = 12
DCGM_NVLINK_MAX_LINKS_PER_GPU = 18
DCGM_MAX_CLOCKS = 256
DCGM_MAX_NUM_GROUPS = 64
DCGM_MAX_BLOB_LENGTH = 4096
DCGM_DEVICE_UUID_BUFFER_SIZE = 80
DCGM_MAX_FBC_SESSIONS = 256

DCGM_ORDER_ASCENDING = 1
DCGM_ORDER_DESCENDING = 2

DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2

## Return codes (dcgmReturn_t)
_dcgmReturn_t = c_uint
DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_MEMORY = -4
DCGM_ST_NOT_CONFIGURED = -5
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_INIT_ERROR = -7
DCGM_ST_NVML_ERROR = -8
DCGM_ST_PENDING = -9
DCGM_ST_UNINITIALIZED = -10
DCGM_ST_TIMEOUT = -11
DCGM_ST_VER_MISMATCH = -12
DCGM_ST_UNKNOWN_FIELD = -13
DCGM_ST_NO_DATA = -14
DCGM_ST_STALE_DATA = -15
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_NO_PERMISSION = -17
DCGM_ST_GPU_IS_LOST = -18
DCGM_ST_RESET_REQUIRED = -19
DCGM_ST_FUNCTION_NOT_FOUND = -20
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_GPU_NOT_SUPPORTED = -22
DCGM_ST_GROUP_INCOMPATIBLE = -23
DCGM_ST_MAX_LIMIT = -24
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_DUPLICATE_KEY = -26
DCGM_ST_GPU_IN_SYNC_BOOST_GROUP = -27
DCGM_ST_GPU_NOT_IN_SYNC_BOOST_GROUP = -28
DCGM_ST_REQUIRES_ROOT = -29
DCGM_ST_NVVS_ERROR = -30
DCGM_ST_INSUFFICIENT_SIZE = -31
DCGM_ST_FIELD_UNSUPPORTED_BY_API = -32
DCGM_ST_MODULE_NOT_LOADED = -33
DCGM_ST_IN_USE = -34
DCGM_ST_GROUP_IS_EMPTY = -35
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_ST_PROFILING_LIBRARY_ERROR = -37
DCGM_ST_PROFILING_MULTI_PASS = -38
DCGM_ST_DIAG_ALREADY_RUNNING = -39
DCGM_ST_DIAG_BAD_JSON = -40
DCGM_ST_DIAG_BAD_LAUNCH = -41
DCGM_ST_DIAG_UNUSED = -42
DCGM_ST_DIAG_THRESHOLD_EXCEEDED = -43
DCGM_ST_INSUFFICIENT_DRIVER_VERSION = -44
DCGM_ST_INSTANCE_NOT_FOUND = -45
DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND = -46
DCGM_ST_CHILD_NOT_KILLED = -47
DCGM_ST_3RD_PARTY_LIBRARY_ERROR = -48
DCGM_ST_INSUFFICIENT_RESOURCES = -49
DCGM_ST_PLUGIN_EXCEPTION = -50
DCGM_ST_NVVS_ISOLATE_ERROR = -51
DCGM_ST_NVVS_BINARY_NOT_FOUND = -52
DCGM_ST_NVVS_KILLED = -53
DCGM_ST_PAUSED = -54
DCGM_ST_ALREADY_INITIALIZED = -55
DCGM_ST_NVML_NOT_LOADED = -56
DCGM_ST_NVML_DRIVER_TIMEOUT = -57
DCGM_ST_NVVS_NO_AVAILABLE_TEST = -58
DCGM_ST_MNDIAG_CONNECTION_NOT_AVAILABLE = -59
DCGM_ST_MNDIAG_CONNECTION_UNAUTHORIZED = -60
DCGM_ST_REMOTE_SSH_CONNECTION_FAILED = -61
DCGM_ST_CHILD_SPAWN_FAILED = -62
DCGM_ST_FILE_IO_ERROR = -63
DCGM_ST_CHILD_SIGNAL_RECEIVED = -64

DCGM_GROUP_DEFAULT = 0  # group type: all GPUs of the node
DCGM_GROUP_EMPTY = 1  # group type: an empty group
DCGM_GROUP_DEFAULT_NVSWITCHES = 2
DCGM_GROUP_DEFAULT_INSTANCES = 3
DCGM_GROUP_DEFAULT_COMPUTE_INSTANCES = 4
DCGM_GROUP_DEFAULT_ENTITIES = 5

DCGM_GROUP_ALL_GPUS = 0x7FFFFFFF
DCGM_GROUP_ALL_NVSWITCHES = 0x7FFFFFFE
DCGM_GROUP_ALL_INSTANCES = 0x7FFFFFFD
DCGM_GROUP_ALL_COMPUTE_INSTANCES = 0x7FFFFFFC
DCGM_GROUP_ALL_ENTITIES = 0x7FFFFFFB
DCGM_GROUP_NULL = 0x7FFFFFFA

DCGM_GROUP_MAX_ENTITIES_V2 = 1024

DCGM_MAX_ERRORS = 5
DCGM_ERR_MSG_LEN = 512

## Library loading (the stand-in's "library" is the fake host engine)
dcgmLib = None
libLoadLock = threading.Lock()
_dcgmLib_refcount = 0


class DCGMError(Exception):
    """DCGM error; DCGMError(code) builds the DCGMError_<Name> subclass for that code."""

    _valClassMapping = {}
    _error_code_to_string = {
        DCGM_ST_OK: "Success",
        DCGM_ST_BADPARAM: "Bad parameter passed to function",
        DCGM_ST_GENERIC_ERROR: "Generic unspecified error",
        DCGM_ST_MEMORY: "Out of memory error",
        DCGM_ST_NOT_CONFIGURED: "Setting not configured",
        DCGM_ST_NOT_SUPPORTED: "Feature not supported",
        DCGM_ST_INIT_ERROR: "DCGM initialization error",
        DCGM_ST_NVML_ERROR: "NVML error",
        DCGM_ST_PENDING: "Object is in a pending state",
        DCGM_ST_UNINITIALIZED: "Object is in an undefined state",
        DCGM_ST_TIMEOUT: "Timeout",
        DCGM_ST_VER_MISMATCH: "API version mismatch",
        DCGM_ST_UNKNOWN_FIELD: "Unknown field",
        DCGM_ST_NO_DATA: "No data is available",
        DCGM_ST_STALE_DATA: "Data is considered stale",
        DCGM_ST_NOT_WATCHED: "Field is not being updated",
        DCGM_ST_NO_PERMISSION: "Not permissioned",
        DCGM_ST_GPU_IS_LOST: "GPU is unreachable",
        DCGM_ST_RESET_REQUIRED: "GPU requires a reset",
        DCGM_ST_FUNCTION_NOT_FOUND: "Unable to find function",
        DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
        DCGM_ST_GPU_NOT_SUPPORTED: "This GPU is not supported by DCGM",
        DCGM_ST_GROUP_INCOMPATIBLE: (
            "GPUs are incompatible with each other for the requested operation"
        ),
        DCGM_ST_MAX_LIMIT: "Max limit reached for the object",
        DCGM_ST_LIBRARY_NOT_FOUND: "DCGM library could not be found",
        DCGM_ST_DUPLICATE_KEY: "Duplicate key passed to function",
        DCGM_ST_GPU_IN_SYNC_BOOST_GROUP: "GPU is already a part of a sync boost group",
        DCGM_ST_GPU_NOT_IN_SYNC_BOOST_GROUP: "GPU is not a part of the sync boost group",
        DCGM_ST_REQUIRES_ROOT: (
            "This operation is not supported when the host engine is running as non root"
        ),
        DCGM_ST_NVVS_ERROR: "DCGM GPU Diagnostic returned an error.",
        DCGM_ST_INSUFFICIENT_SIZE: "An input argument is not large enough",
        DCGM_ST_FIELD_UNSUPPORTED_BY_API: (
            "The given field ID is not supported by the API being called"
        ),
        DCGM_ST_MODULE_NOT_LOADED: (
            "This request is serviced by a module of DCGM that is not currently loaded"
        ),
        DCGM_ST_IN_USE: (
            "The requested operation could not be completed because the affected resource is in use"
        ),
        DCGM_ST_GROUP_IS_EMPTY: (
            "The specified group is empty, and this operation is incompatible with an empty group"
        ),
        DCGM_ST_PROFILING_NOT_SUPPORTED: "Profiling is not supported for this group of GPUs or GPU",
        DCGM_ST_PROFILING_LIBRARY_ERROR: (
            "The third-party Profiling module returned an unrecoverable error"
        ),
        DCGM_ST_PROFILING_MULTI_PASS: (
            "The requested profiling metrics cannot be collected in a single pass"
        ),
        DCGM_ST_DIAG_ALREADY_RUNNING: (
            "A diag instance is already running, cannot run a new diag until the current one "
            "finishes"
        ),
        DCGM_ST_DIAG_BAD_JSON: "The GPU Diagnostic returned Json that cannot be parsed.",
        DCGM_ST_DIAG_BAD_LAUNCH: "Error while launching the GPU Diagnostic.",
        DCGM_ST_DIAG_UNUSED: "Unused error code",
        DCGM_ST_DIAG_THRESHOLD_EXCEEDED: "A field value met or exceeded the error threshold.",
        DCGM_ST_INSUFFICIENT_DRIVER_VERSION: (
            "The installed driver version is insufficient for this API"
        ),
        DCGM_ST_INSTANCE_NOT_FOUND: "The specified GPU instance does not exist",
        DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND: "The specified GPU compute instance does not exist",
        DCGM_ST_CHILD_NOT_KILLED: "Couldn't kill a child process within the retries",
        DCGM_ST_3RD_PARTY_LIBRARY_ERROR: "Detected an error in a 3rd-party library",
        DCGM_ST_INSUFFICIENT_RESOURCES: "Not enough resources available",
        DCGM_ST_PLUGIN_EXCEPTION: "Exception thrown from a diagnostic plugin",
        DCGM_ST_NVVS_ISOLATE_ERROR: (
            "The diagnostic returned an error that indicates the need for isolation"
        ),
        DCGM_ST_NVVS_BINARY_NOT_FOUND: "The NVVS binary was not found in the specified location",
        DCGM_ST_NVVS_KILLED: "The NVVS process was killed by a signal",
        DCGM_ST_PAUSED: "The hostengine and all modules are paused",
        DCGM_ST_ALREADY_INITIALIZED: "The object is already initialized",
        DCGM_ST_NVML_NOT_LOADED: "NVML couldn't be loaded on this system",
        DCGM_ST_NVML_DRIVER_TIMEOUT: "NVML driver timeout error was detected",
        DCGM_ST_NVVS_NO_AVAILABLE_TEST: (
            "The NVVS returns no available tests (NVVS_ST_TEST_NOT_FOUND)"
        ),
        DCGM_ST_MNDIAG_CONNECTION_NOT_AVAILABLE: (
            "No connection is currently authorized for multi-node diagnostic"
        ),
        DCGM_ST_MNDIAG_CONNECTION_UNAUTHORIZED: (
            "The connection is not authorized for multi-node diagnostic operations"
        ),
        DCGM_ST_REMOTE_SSH_CONNECTION_FAILED: "An SSH connection to a remote hostengine failed",
        DCGM_ST_CHILD_SPAWN_FAILED: "A child process could not be spawned",
        DCGM_ST_FILE_IO_ERROR: "A file operation failed",
        DCGM_ST_CHILD_SIGNAL_RECEIVED: "A child process received a signal",
    }

    def __new__(cls, value):
        if cls is DCGMError:
            cls = DCGMError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.info = None
        obj.value = value
        return obj

    def __str__(self):
        try:
            if self.value not in DCGMError._error_code_to_string:
                DCGMError._error_code_to_string[self.value] = str(_dcgmErrorString(self.value))
            msg = DCGMError._error_code_to_string[self.value]
        except BaseException:
            msg = "DCGM Error with code %d" % self.value
        if self.info is not None:
            if msg.endswith("."):
                msg = msg[:-1]
            msg += ": '%s'" % self.info
        return msg

    def __eq__(self, other):
        return self.value == other.value

    def __hash__(self):
        return hash(self.value)

    def SetAdditionalInfo(self, msg):
        """Extra text shown by str() after the code's message."""
        self.info = msg


def dcgmExceptionClass(error_code):
    return DCGMError._valClassMapping.get(error_code)


def _extractDCGMErrorsAsClasses():
    """A DCGMError subclass per DCGM_ST_* code: DCGM_ST_NOT_SUPPORTED -> DCGMError_NotSupported."""
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("DCGM_ST_")]:
        code = getattr(module, name)
        class_name = "DCGMError_" + string.capwords(name[len("DCGM_ST_") :], "_").replace("_", "")

        def make_new(val):
            def new(cls):
                return DCGMError.__new__(cls, val)

            return new

        cls = type(class_name, (DCGMError,), {"__new__": make_new(code)})
        cls.__module__ = __name__
        setattr(module, class_name, cls)
        DCGMError._valClassMapping[code] = cls


_extractDCGMErrorsAsClasses()


class _WrappedStructure:
    def __init__(self, obj):
        self.__dict__["_obj"] = obj

    def __getattr__(self, key):
        value = getattr(self._obj, key)
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isclass(value):
            return _WrappedStructure(value)
        return value

    def __getitem__(self, key):
        value = self._obj[key]
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isclass(value):
            return _WrappedStructure(value)
        return value

    def __setattr__(self, key, raw_value):
        if key == "_obj":
            raise RuntimeError("Cannot set _obj")
        self._obj[key] = _coerce(self._obj._fields_, key, raw_value)
        return raw_value


def _coerce(fields, key, raw_value):
    # str -> utf-8 bytes for char arrays; numbers for c_uint/c_int fields.
    fieldtype = next((f[1] for f in fields if f[0] == key), None)
    if fieldtype == c_uint and not isinstance(raw_value, c_uint32):
        return int(raw_value)
    if fieldtype == c_int and not isinstance(raw_value, c_int32):
        return int(raw_value)
    if isinstance(raw_value, str):
        return raw_value.encode("utf-8")
    return raw_value


class _DcgmStructure(Structure):
    def __getattribute__(self, key):
        value = super().__getattribute__(key)
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isclass(value):
            return _WrappedStructure(value)
        return value

    def __setattr__(self, key, raw_value):
        return super().__setattr__(key, _coerce(self._fields_, key, raw_value))


class DcgmUnion(Union):
    def __getattribute__(self, key):
        value = super().__getattribute__(key)
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isclass(value):
            return _WrappedStructure(value)
        return value

    def __setattr__(self, key, raw_value):
        return super().__setattr__(key, _coerce(self._fields_, key, raw_value))


class _PrintableStructure(_DcgmStructure):
    """Structure whose str() lists its fields: name(field: value, ...)."""

    _fmt_ = {}

    def __str__(self):
        parts = []
        for name, _type in self._fields_:
            fmt = self._fmt_.get(name, self._fmt_.get("<default>", "%s"))
            parts.append(("%s: " + fmt) % (name, getattr(self, name)))
        return self.__class__.__name__ + "(" + ", ".join(parts) + ")"

    def FieldsSizeof(self):
        return sum(sizeof(t) for _name, t in self._fields_)


class DcgmJSONEncoder(json.JSONEncoder):
    def default(self, o):
        if isinstance(o, _PrintableStructure):
            out = {}
            for name, _type in o._fields_:
                sub = getattr(o, name)
                out[name] = self.default(sub) if isinstance(sub, _PrintableStructure) else sub
            return out
        if isinstance(o, Array):
            return [self.default(item) for item in o]
        return json.JSONEncoder.default(self, o)


def make_dcgm_version(struct, ver):
    """The version word of a versioned struct: its size, with the version in the top byte."""
    return sizeof(struct) | (ver << 24)


## Function access
_dcgmGetFunctionPointer_cache = {}


def _dcgmGetFunctionPointer(name):
    if name in _dcgmGetFunctionPointer_cache:
        return _dcgmGetFunctionPointer_cache[name]
    with libLoadLock:
        if dcgmLib is None:
            raise DCGMError(DCGM_ST_UNINITIALIZED)
        try:
            fn = getattr(dcgmLib, name)
        except AttributeError:
            raise DCGMError(DCGM_ST_FUNCTION_NOT_FOUND) from None
        _dcgmGetFunctionPointer_cache[name] = fn
        return fn


def _LoadDcgmLibrary(libDcgmPath=None):
    """Load the library if it is not loaded yet; DCGMError_LibraryNotFound when there is none.

    The real function looks for libdcgm.so.4 (libDcgmPath, LD_LIBRARY_PATH, /usr/lib*); the
    stand-in asks its fake host engine whether the library is "installed".
    """
    global dcgmLib
    if dcgmLib is not None:
        return
    with libLoadLock:
        if dcgmLib is None:
            import _standin_engine  # noqa: PLC0415 - the stand-in's library

            dcgmLib = _standin_engine.load_library(libDcgmPath)
    if dcgmLib is None:
        _dcgmCheckReturn(DCGM_ST_LIBRARY_NOT_FOUND)


def _dcgmInit(libDcgmPath=None):
    global _dcgmLib_refcount
    _LoadDcgmLibrary(libDcgmPath)
    with libLoadLock:
        _dcgmLib_refcount += 1


def _dcgmCheckReturn(ret):
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def _dcgmShutdown():
    global _dcgmLib_refcount
    fn = _dcgmGetFunctionPointer("dcgmShutdown")
    _dcgmCheckReturn(fn())
    with libLoadLock:
        if _dcgmLib_refcount > 0:
            _dcgmLib_refcount -= 1


def _dcgmErrorString(result):
    fn = _dcgmGetFunctionPointer("dcgmErrorString")
    return fn(result)


## Connection
class c_dcgmConnectV2Params_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("persistAfterDisconnect", c_uint),
    ]


c_dcgmConnectV2Params_version1 = make_dcgm_version(c_dcgmConnectV2Params_v1, 1)


class c_dcgmConnectV2Params_v2(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("persistAfterDisconnect", c_uint),
        ("timeoutMs", c_uint),
        ("addressIsUnixSocket", c_uint),
    ]


c_dcgmConnectV2Params_version2 = make_dcgm_version(c_dcgmConnectV2Params_v2, 2)
c_dcgmConnectV2Params_version = c_dcgmConnectV2Params_version2


class c_dcgmHostengineHealth_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("overallHealth", c_uint),
    ]


dcgmHostengineHealth_version1 = make_dcgm_version(c_dcgmHostengineHealth_v1, 1)
dcgmHostengineHealth_version = dcgmHostengineHealth_version1


## Groups and devices
class c_dcgmClockSet_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("memClock", c_uint),
        ("smClock", c_uint),
    ]


class c_dcgmGroupEntityPair_t(_PrintableStructure):
    _fields_ = [
        ("entityGroupId", c_uint32),
        ("entityId", c_uint32),
    ]

    def __eq__(self, other):
        return self.entityGroupId == other.entityGroupId and self.entityId == other.entityId

    __hash__ = None


class c_dcgmGroupInfo_v3(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("count", c_uint),
        ("groupName", c_char * DCGM_MAX_STR_LENGTH),
        ("entityList", c_dcgmGroupEntityPair_t * DCGM_GROUP_MAX_ENTITIES_V2),
    ]


c_dcgmGroupInfo_version3 = make_dcgm_version(c_dcgmGroupInfo_v3, 3)


class c_dcgmErrorInfo_v1(_PrintableStructure):
    _fields_ = [
        ("gpuId", c_uint),
        ("fieldId", c_ushort),
        ("status", c_int),
    ]


class c_dcgmDeviceSupportedClockSets_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("count", c_uint),
        ("clockSet", c_dcgmClockSet_v1 * DCGM_MAX_CLOCKS),
    ]


class c_dcgmDevicePidAccountingStats_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("pid", c_uint32),
        ("gpuUtilization", c_uint32),
        ("memoryUtilization", c_uint32),
        ("maxMemoryUsage", c_uint64),
        ("startTimestamp", c_uint64),
        ("activeTimeUsec", c_uint64),
    ]


class c_dcgmDeviceThermals_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("slowdownTemp", c_uint),
        ("shutdownTemp", c_uint),
    ]


class c_dcgmDevicePowerLimits_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("curPowerLimit", c_uint),
        ("defaultPowerLimit", c_uint),
        ("enforcedPowerLimit", c_uint),
        ("minPowerLimit", c_uint),
        ("maxPowerLimit", c_uint),
    ]


class c_dcgmDeviceIdentifiers_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("brandName", c_char * DCGM_MAX_STR_LENGTH),
        ("deviceName", c_char * DCGM_MAX_STR_LENGTH),
        ("pciBusId", c_char * DCGM_MAX_STR_LENGTH),
        ("serial", c_char * DCGM_MAX_STR_LENGTH),
        ("uuid", c_char * DCGM_MAX_STR_LENGTH),
        ("vbios", c_char * DCGM_MAX_STR_LENGTH),
        ("inforomImageVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("pciDeviceId", c_uint32),
        ("pciSubSystemId", c_uint32),
        ("driverVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("virtualizationMode", c_uint32),
    ]


class c_dcgmDeviceMemoryUsage_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("bar1Total", c_uint),
        ("fbTotal", c_uint),
        ("fbUsed", c_uint),
        ("fbFree", c_uint),
    ]


class c_dcgmDeviceSettings_v2(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("persistenceModeEnabled", c_uint),
        ("migModeEnabled", c_uint),
        ("confidentialComputeMode", c_uint),
    ]


class c_dcgmDeviceAttributes_v3(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("clockSets", c_dcgmDeviceSupportedClockSets_v1),
        ("thermalSettings", c_dcgmDeviceThermals_v1),
        ("powerLimits", c_dcgmDevicePowerLimits_v1),
        ("identifiers", c_dcgmDeviceIdentifiers_v1),
        ("memoryUsage", c_dcgmDeviceMemoryUsage_v1),
        ("settings", c_dcgmDeviceSettings_v2),
    ]


dcgmDeviceAttributes_version3 = make_dcgm_version(c_dcgmDeviceAttributes_v3, 3)


## Policy
class c_dcgmPolicyViolation_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("notifyOnEccDbe", c_uint),
        ("notifyOnPciEvent", c_uint),
        ("notifyOnMaxRetiredPages", c_uint),
    ]


dcgmPolicyViolation_version1 = make_dcgm_version(c_dcgmPolicyViolation_v1, 1)

DCGM_POLICY_COND_IDX_DBE = 0
DCGM_POLICY_COND_IDX_PCI = 1
DCGM_POLICY_COND_IDX_MAX_PAGES_RETIRED = 2
DCGM_POLICY_COND_IDX_THERMAL = 3
DCGM_POLICY_COND_IDX_POWER = 4
DCGM_POLICY_COND_IDX_NVLINK = 5
DCGM_POLICY_COND_IDX_XID = 6
DCGM_POLICY_COND_IDX_MAX = 7

DCGM_POLICY_COND_DBE = 0x1
DCGM_POLICY_COND_PCI = 0x2
DCGM_POLICY_COND_MAX_PAGES_RETIRED = 0x4
DCGM_POLICY_COND_THERMAL = 0x8
DCGM_POLICY_COND_POWER = 0x10
DCGM_POLICY_COND_NVLINK = 0x20
DCGM_POLICY_COND_XID = 0x40
DCGM_POLICY_COND_MAX = 7

DCGM_POLICY_MODE_AUTOMATED = 0
DCGM_POLICY_MODE_MANUAL = 1

DCGM_POLICY_ISOLATION_NONE = 0

DCGM_POLICY_ACTION_NONE = 0
DCGM_POLICY_ACTION_GPURESET = 1  # deprecated

DCGM_POLICY_VALID_NONE = 0
DCGM_POLICY_VALID_SV_SHORT = 1
DCGM_POLICY_VALID_SV_MED = 2
DCGM_POLICY_VALID_SV_LONG = 3
DCGM_POLICY_VALID_SV_XLONG = 4

DCGM_POLICY_FAILURE_NONE = 0

DCGM_DIAG_LVL_INVALID = 0
DCGM_DIAG_LVL_SHORT = 10
DCGM_DIAG_LVL_MED = 20
DCGM_DIAG_LVL_LONG = 30
DCGM_DIAG_LVL_XLONG = 40

DCGM_DIAG_RESULT_PASS = 0
DCGM_DIAG_RESULT_SKIP = 1
DCGM_DIAG_RESULT_WARN = 2
DCGM_DIAG_RESULT_FAIL = 3
DCGM_DIAG_RESULT_NOT_RUN = 4


class c_dcgmPolicyConditionParmTypes_t(DcgmUnion):
    _fields_ = [
        ("boolean", c_bool),
        ("llval", c_longlong),
    ]


class c_dcgmPolicyConditionParms_t(_PrintableStructure):
    _fields_ = [
        ("tag", c_uint),
        ("val", c_dcgmPolicyConditionParmTypes_t),
    ]


class c_dcgmPolicy_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("condition", c_uint),  # OR of DCGM_POLICY_COND_*
        ("mode", c_uint),
        ("isolation", c_uint),
        ("action", c_uint),
        ("validation", c_uint),
        ("response", c_uint),
        ("parms", c_dcgmPolicyConditionParms_t * DCGM_POLICY_COND_MAX),
    ]


dcgmPolicy_version1 = make_dcgm_version(c_dcgmPolicy_v1, 1)


class c_dcgmPolicyConditionPci_t(_PrintableStructure):
    _fields_ = [
        ("timestamp", c_longlong),
        ("counter", c_uint),
    ]


class c_dcgmPolicyConditionDbe_t(_PrintableStructure):
    LOCATIONS = {"L1": 0, "L2": 1, "DEVICE": 2, "REGISTER": 3, "TEXTURE": 4}

    _fields_ = [
        ("timestamp", c_longlong),
        ("location", c_int),
        ("numerrors", c_uint),
    ]


class c_dcgmPolicyConditionMpr_t(_PrintableStructure):
    _fields_ = [
        ("timestamp", c_longlong),
        ("sbepages", c_uint),
        ("dbepages", c_uint),
    ]


class c_dcgmPolicyConditionThermal_t(_PrintableStructure):
    _fields_ = [
        ("timestamp", c_longlong),
        ("thermalViolation", c_uint),
    ]


class c_dcgmPolicyConditionPower_t(_PrintableStructure):
    _fields_ = [
        ("timestamp", c_longlong),
        ("powerViolation", c_uint),
    ]


class c_dcgmPolicyConditionNvlink_t(_PrintableStructure):
    _fields_ = [
        ("timestamp", c_longlong),
        ("fieldId", c_ushort),
        ("counter", c_uint),
    ]


class c_dcgmPolicyConditionXID_t(_PrintableStructure):
    _fields_ = [
        ("timestamp", c_longlong),
        ("errnum", c_uint),
    ]


class c_dcgmPolicyCallbackResponse_v2(_PrintableStructure):
    class Value(DcgmUnion):
        _fields_ = [
            ("dbe", c_dcgmPolicyConditionDbe_t),
            ("pci", c_dcgmPolicyConditionPci_t),
            ("mpr", c_dcgmPolicyConditionMpr_t),
            ("thermal", c_dcgmPolicyConditionThermal_t),
            ("power", c_dcgmPolicyConditionPower_t),
            ("nvlink", c_dcgmPolicyConditionNvlink_t),
            ("xid", c_dcgmPolicyConditionXID_t),
        ]

    _fields_ = [
        ("version", c_uint),
        ("condition", c_int),  # the DCGM_POLICY_COND_* bit that was violated
        ("val", Value),
        ("gpuId", c_uint),
    ]


## Field values
class c_dcgmFieldValue_v1_value(DcgmUnion):
    _fields_ = [
        ("i64", c_int64),
        ("dbl", c_double),
        ("str", c_char * DCGM_MAX_STR_LENGTH),
        ("blob", c_byte * DCGM_MAX_BLOB_LENGTH),
    ]


class c_dcgmFieldValue_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("fieldId", c_ushort),
        ("fieldType", c_short),
        ("status", c_int),
        ("ts", c_int64),
        ("value", c_dcgmFieldValue_v1_value),
    ]


dcgmFieldValue_version1 = make_dcgm_version(c_dcgmFieldValue_v1, 1)


class c_dcgmFieldValue_v2(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("entityGroupId", c_uint),
        ("entityId", c_uint),
        ("fieldId", c_ushort),
        ("fieldType", c_short),
        ("status", c_int),
        ("unused", c_uint),
        ("ts", c_int64),
        ("value", c_dcgmFieldValue_v1_value),
    ]


dcgmFieldValue_version2 = make_dcgm_version(c_dcgmFieldValue_v2, 2)

DCGM_FV_FLAG_LIVE_DATA = 0x00000001

## Health
DCGM_HEALTH_WATCH_PCIE = 0x1
DCGM_HEALTH_WATCH_NVLINK = 0x2
DCGM_HEALTH_WATCH_PMU = 0x4
DCGM_HEALTH_WATCH_MCU = 0x8
DCGM_HEALTH_WATCH_MEM = 0x10
DCGM_HEALTH_WATCH_SM = 0x20
DCGM_HEALTH_WATCH_INFOROM = 0x40
DCGM_HEALTH_WATCH_THERMAL = 0x80
DCGM_HEALTH_WATCH_POWER = 0x100
DCGM_HEALTH_WATCH_DRIVER = 0x200
DCGM_HEALTH_WATCH_NVSWITCH_NONFATAL = 0x400
DCGM_HEALTH_WATCH_NVSWITCH_FATAL = 0x800
DCGM_HEALTH_WATCH_ALL = 0xFFFFFFFF
DCGM_HEALTH_WATCH_COUNT_V1 = 10
DCGM_HEALTH_WATCH_COUNT_V2 = 12

DCGM_HEALTH_RESULT_PASS = 0
DCGM_HEALTH_RESULT_WARN = 10
DCGM_HEALTH_RESULT_FAIL = 20


class c_dcgmDiagErrorDetail_t(_PrintableStructure):
    _fields_ = [
        ("msg", c_char * 1024),
        ("code", c_uint),
    ]


class c_dcgmDiagErrorDetail_v2(_PrintableStructure):
    _fields_ = [
        ("msg", c_char * DCGM_ERR_MSG_LEN),
        ("gpuId", c_int),
        ("code", c_uint),
        ("category", c_uint),
        ("severity", c_uint),
    ]


DCGM_DEVICE_ID_LEN = 5


class c_dcgmDiagEntity_v1(_PrintableStructure):
    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("serialNum", c_char * DCGM_MAX_STR_LENGTH),
        ("skuDeviceId", c_char * DCGM_DEVICE_ID_LEN),
    ]


DCGM_HEALTH_WATCH_MAX_INCIDENTS_V2 = DCGM_GROUP_MAX_ENTITIES_V2


class c_dcgmIncidentInfo_t(_PrintableStructure):
    _fields_ = [
        ("system", c_uint),
        ("health", c_uint32),
        ("error", c_dcgmDiagErrorDetail_t),
        ("entityInfo", c_dcgmGroupEntityPair_t),
    ]


class c_dcgmHealthResponse_v5(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("overallHealth", c_uint32),
        ("incidentCount", c_uint32),
        ("incidents", c_dcgmIncidentInfo_t * DCGM_HEALTH_WATCH_MAX_INCIDENTS_V2),
    ]


dcgmHealthResponse_version5 = make_dcgm_version(c_dcgmHealthResponse_v5, 5)


class c_dcgmHealthSetParams_v2(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("groupId", c_void_p),
        ("systems", c_uint32),
        ("updateInterval", c_int64),
        ("maxKeepAge", c_double),
    ]


dcgmHealthSetParams_version2 = make_dcgm_version(c_dcgmHealthSetParams_v2, 2)


class c_dcgmHealthResponseInfo_t(_PrintableStructure):
    _fields_ = [
        ("system", c_uint),
        ("health", c_uint),
    ]


class c_dcgmRunningProcess_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("pid", c_uint32),
        ("memoryUsed", c_uint64),
    ]


dcgmRunningProcess_version1 = make_dcgm_version(c_dcgmRunningProcess_v1, 1)
c_dcgmRunningProcess_t = c_dcgmRunningProcess_v1


## Diagnostics
class c_dcgmDiagInfo_v1(_PrintableStructure):
    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("msg", c_char * DCGM_ERR_MSG_LEN),
        ("testId", c_uint),
    ]


class c_dcgmDiagError_v1(_PrintableStructure):
    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("code", c_uint),
        ("category", c_uint),
        ("severity", c_uint),
        ("msg", c_char * DCGM_ERR_MSG_LEN),
        ("testId", c_uint),
    ]


DCGM_DIAG_AUX_DATA_LEN = 2048


class c_dcgmDiagTestAuxData_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("data", c_char * DCGM_DIAG_AUX_DATA_LEN),
    ]


dcgmDiagTestAuxData_version1 = make_dcgm_version(c_dcgmDiagTestAuxData_v1, 1)
dcgmDiagTestAuxData_version = dcgmDiagTestAuxData_version1


class c_dcgmDiagEntityResult_v1(_PrintableStructure):
    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("result", c_int32),
        ("testId", c_uint),
    ]


DCGM_DIAG_TEST_RUN_ERROR_INDICES_MAX = 32
DCGM_DIAG_TEST_RUN_INFO_INDICES_MAX = 16
DCGM_DIAG_TEST_RUN_RESULTS_MAX = DCGM_GROUP_MAX_ENTITIES_V2
DCGM_DIAG_TEST_RUN_NAME_LEN = 32
DCGM_DIAG_TEST_RUN_INFO_INDICES_MAX_V2 = 128


class c_dcgmDiagTestRun_v2(_PrintableStructure):
    _fields_ = [
        ("name", c_char * DCGM_DIAG_TEST_RUN_NAME_LEN),
        ("pluginName", c_char * DCGM_DIAG_TEST_RUN_NAME_LEN),
        ("result", c_uint),
        ("numErrors", c_ubyte),
        ("numInfo", c_ubyte),
        ("categoryIndex", c_ubyte),
        ("_unused", c_ubyte),
        ("numResults", c_ushort),
        ("errorIndices", c_ubyte * DCGM_DIAG_TEST_RUN_ERROR_INDICES_MAX),
        ("infoIndices", c_ubyte * DCGM_DIAG_TEST_RUN_INFO_INDICES_MAX_V2),
        ("resultIndices", c_ushort * DCGM_DIAG_TEST_RUN_RESULTS_MAX),
        ("auxData", c_dcgmDiagTestAuxData_v1),
    ]


class c_dcgmDiagTestRun_v1(_PrintableStructure):
    _fields_ = [
        ("name", c_char * DCGM_DIAG_TEST_RUN_NAME_LEN),
        ("pluginName", c_char * DCGM_DIAG_TEST_RUN_NAME_LEN),
        ("result", c_uint),
        ("numErrors", c_ubyte),
        ("numInfo", c_ubyte),
        ("categoryIndex", c_ubyte),
        ("_unused", c_ubyte),
        ("numResults", c_ushort),
        ("errorIndices", c_ubyte * DCGM_DIAG_TEST_RUN_ERROR_INDICES_MAX),
        ("infoIndices", c_ubyte * DCGM_DIAG_TEST_RUN_INFO_INDICES_MAX),
        ("resultIndices", c_ushort * DCGM_DIAG_TEST_RUN_RESULTS_MAX),
        ("auxData", c_dcgmDiagTestAuxData_v1),
    ]


DCGM_SWTEST_COUNT = 10
LEVEL_ONE_MAX_RESULTS = 16
DCGM_VERSION_LEN = 12

DCGM_DIAG_RESPONSE_TESTS_MAX = 20
DCGM_DIAG_RESPONSE_SYSTEM_ERROR = dcgmvalue.DCGM_INT8_BLANK
DCGM_DIAG_RESPONSE_ERRORS_MAX = DCGM_DIAG_TEST_RUN_ERROR_INDICES_MAX
DCGM_DIAG_RESPONSE_INFO_MAX = DCGM_DIAG_TEST_RUN_INFO_INDICES_MAX
DCGM_DIAG_RESPONSE_ENTITIES_MAX = DCGM_GROUP_MAX_ENTITIES_V2
DCGM_DIAG_RESPONSE_RESULTS_MAX = DCGM_DIAG_RESPONSE_TESTS_MAX * DCGM_DIAG_RESPONSE_ENTITIES_MAX
DCGM_DIAG_RESPONSE_CATEGORIES_MAX = 5
DCGM_DIAG_RESPONSE_CATEGORY_LEN = 20
DCGM_DIAG_RESPONSE_V11_UNUSED_LEN = 682880
DCGM_DIAG_RESPONSE_V12_UNUSED_LEN = 621952
DCGM_DIAG_RESPONSE_INFO_MAX_V2 = DCGM_DIAG_TEST_RUN_INFO_INDICES_MAX_V2


class c_dcgmDiagResponse_v12(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("numTests", c_ubyte),
        ("numErrors", c_ubyte),
        ("numInfo", c_ubyte),
        ("numCategories", c_ubyte),
        ("numEntities", c_ushort),
        ("numResults", c_ushort),
        ("tests", c_dcgmDiagTestRun_v2 * DCGM_DIAG_RESPONSE_TESTS_MAX),
        ("entities", c_dcgmDiagEntity_v1 * DCGM_DIAG_RESPONSE_ENTITIES_MAX),
        ("errors", c_dcgmDiagError_v1 * DCGM_DIAG_RESPONSE_ERRORS_MAX),
        ("info", c_dcgmDiagInfo_v1 * DCGM_DIAG_RESPONSE_INFO_MAX_V2),
        ("results", c_dcgmDiagEntityResult_v1 * DCGM_DIAG_RESPONSE_RESULTS_MAX),
        (
            "categories",
            (c_char * DCGM_DIAG_RESPONSE_CATEGORY_LEN) * DCGM_DIAG_RESPONSE_CATEGORIES_MAX,
        ),
        ("dcgmVersion", c_char * DCGM_VERSION_LEN),
        ("dcgmDriverVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("_unused", c_char * DCGM_DIAG_RESPONSE_V12_UNUSED_LEN),
    ]


dcgmDiagResponse_version12 = make_dcgm_version(c_dcgmDiagResponse_v12, 12)


class c_dcgmDiagResponse_v11(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("numTests", c_ubyte),
        ("numErrors", c_ubyte),
        ("numInfo", c_ubyte),
        ("numCategories", c_ubyte),
        ("numEntities", c_ushort),
        ("numResults", c_ushort),
        ("tests", c_dcgmDiagTestRun_v1 * DCGM_DIAG_RESPONSE_TESTS_MAX),
        ("entities", c_dcgmDiagEntity_v1 * DCGM_DIAG_RESPONSE_ENTITIES_MAX),
        ("errors", c_dcgmDiagError_v1 * DCGM_DIAG_RESPONSE_ERRORS_MAX),
        ("info", c_dcgmDiagInfo_v1 * DCGM_DIAG_RESPONSE_INFO_MAX),
        ("results", c_dcgmDiagEntityResult_v1 * DCGM_DIAG_RESPONSE_RESULTS_MAX),
        (
            "categories",
            (c_char * DCGM_DIAG_RESPONSE_CATEGORY_LEN) * DCGM_DIAG_RESPONSE_CATEGORIES_MAX,
        ),
        ("dcgmVersion", c_char * DCGM_VERSION_LEN),
        ("dcgmDriverVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("_unused", c_char * DCGM_DIAG_RESPONSE_V11_UNUSED_LEN),
    ]


dcgmDiagResponse_version11 = make_dcgm_version(c_dcgmDiagResponse_v11, 11)

## Field groups
DCGM_MAX_NUM_FIELD_GROUPS = 64
DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP = 128


class c_dcgmFieldGroupInfo_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("numFieldIds", c_uint32),
        ("fieldGroupId", c_void_p),
        ("fieldGroupName", c_char * DCGM_MAX_STR_LENGTH),
        ("fieldIds", c_uint16 * DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP),
    ]


dcgmFieldGroupInfo_version1 = make_dcgm_version(c_dcgmFieldGroupInfo_v1, 1)


class c_dcgmAllFieldGroup_v1(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("numFieldGroups", c_uint32),
        ("fieldGroups", c_dcgmFieldGroupInfo_v1 * DCGM_MAX_NUM_FIELD_GROUPS),
    ]


dcgmAllFieldGroup_version1 = make_dcgm_version(c_dcgmAllFieldGroup_v1, 1)

## Run-diag request
DCGM_MAX_CONFIG_FILE_LEN = 10000
DCGM_MAX_TEST_NAMES = 20
DCGM_MAX_TEST_NAMES_LEN = 50
DCGM_MAX_TEST_PARMS = 100
DCGM_MAX_TEST_PARMS_LEN = 100
DCGM_MAX_TEST_PARMS_LEN_V2 = 1050
DCGM_GPU_LIST_LEN = 50
DCGM_ENTITY_ID_LIST_LEN = 2048
DCGM_EXPECTED_ENTITIES_LEN = 50
DCGM_FILE_LEN = 30
DCGM_PATH_LEN = 128
DCGM_CLOCKS_EVENT_MASK_LEN = 50
DCGM_IGNORE_ERROR_MAX_LEN = 512
DCGM_THROTTLE_MASK_LEN = DCGM_CLOCKS_EVENT_MASK_LEN

DCGM_RUN_FLAGS_VERBOSE = 0x0001
DCGM_RUN_FLAGS_STATSONFAIL = 0x0002
DCGM_RUN_FLAGS_TRAIN = 0x0004  # unused
DCGM_RUN_FLAGS_FORCE_TRAIN = 0x0008  # unused
DCGM_RUN_FLAGS_FAIL_EARLY = 0x0010


class c_dcgmRunDiag_v7(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("flags", c_uint),
        ("debugLevel", c_uint),
        ("groupId", c_void_p),
        ("validate", c_uint),
        ("testNames", (c_char * DCGM_MAX_TEST_NAMES_LEN) * DCGM_MAX_TEST_NAMES),
        ("testParms", (c_char * DCGM_MAX_TEST_PARMS_LEN) * DCGM_MAX_TEST_PARMS),
        ("fakeGpuList", c_char * DCGM_GPU_LIST_LEN),
        ("gpuList", c_char * DCGM_GPU_LIST_LEN),
        ("debugLogFile", c_char * DCGM_PATH_LEN),
        ("statsPath", c_char * DCGM_PATH_LEN),
        ("configFileContents", c_char * DCGM_MAX_CONFIG_FILE_LEN),
        ("clocksEventMask", c_char * DCGM_CLOCKS_EVENT_MASK_LEN),
        ("pluginPath", c_char * DCGM_PATH_LEN),
        ("currentIteration", c_uint),
        ("totalIterations", c_uint),
        ("timeoutSeconds", c_uint),
        ("_unusedBuf", c_char * DCGM_PATH_LEN),
        ("failCheckInterval", c_uint),
    ]


dcgmRunDiag_version7 = make_dcgm_version(c_dcgmRunDiag_v7, 7)


class c_dcgmRunDiag_v8(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("flags", c_uint),
        ("debugLevel", c_uint),
        ("groupId", c_void_p),
        ("validate", c_uint),
        ("testNames", c_char * DCGM_MAX_TEST_NAMES_LEN * DCGM_MAX_TEST_NAMES),
        ("testParms", c_char * DCGM_MAX_TEST_PARMS_LEN_V2 * DCGM_MAX_TEST_PARMS),
        ("fakeGpuList", c_char * DCGM_GPU_LIST_LEN),
        ("gpuList", c_char * DCGM_GPU_LIST_LEN),
        ("debugLogFile", c_char * DCGM_PATH_LEN),
        ("statsPath", c_char * DCGM_PATH_LEN),
        ("configFileContents", c_char * DCGM_MAX_CONFIG_FILE_LEN),
        ("throttleMask", c_char * DCGM_THROTTLE_MASK_LEN),
        ("pluginPath", c_char * DCGM_PATH_LEN),
        ("currentIterations", c_uint),
        ("totalIterations", c_uint),
        ("timeoutSeconds", c_uint),
        ("_unusedBuf", c_char * DCGM_PATH_LEN),
        ("failCheckInterval", c_uint),
        ("expectedNumEntities", c_char * DCGM_EXPECTED_ENTITIES_LEN),
    ]


dcgmRunDiag_version8 = make_dcgm_version(c_dcgmRunDiag_v8, 8)


class c_dcgmRunDiag_v9(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("flags", c_uint),
        ("debugLevel", c_uint),
        ("groupId", c_void_p),
        ("validate", c_uint),
        ("testNames", c_char * DCGM_MAX_TEST_NAMES_LEN * DCGM_MAX_TEST_NAMES),
        ("testParms", c_char * DCGM_MAX_TEST_PARMS_LEN_V2 * DCGM_MAX_TEST_PARMS),
        ("fakeGpuList", c_char * DCGM_GPU_LIST_LEN),
        ("debugLogFile", c_char * DCGM_PATH_LEN),
        ("statsPath", c_char * DCGM_PATH_LEN),
        ("configFileContents", c_char * DCGM_MAX_CONFIG_FILE_LEN),
        ("clocksEventMask", c_char * DCGM_CLOCKS_EVENT_MASK_LEN),
        ("pluginPath", c_char * DCGM_PATH_LEN),
        ("currentIterations", c_uint),
        ("totalIterations", c_uint),
        ("timeoutSeconds", c_uint),
        ("_unusedBuf", c_char * DCGM_PATH_LEN),
        ("failCheckInterval", c_uint),
        ("expectedNumEntities", c_char * DCGM_EXPECTED_ENTITIES_LEN),
        ("entityIds", c_char * DCGM_ENTITY_ID_LIST_LEN),
        ("watchFrequency", c_uint),
    ]


dcgmRunDiag_version9 = make_dcgm_version(c_dcgmRunDiag_v9, 9)


class c_dcgmRunDiag_v10(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("flags", c_uint),
        ("debugLevel", c_uint),
        ("groupId", c_void_p),  # DCGM_GROUP_NULL when entityIds is used
        ("validate", c_uint),  # level 1-4, or 0 with testNames
        ("testNames", c_char * DCGM_MAX_TEST_NAMES_LEN * DCGM_MAX_TEST_NAMES),
        ("testParms", c_char * DCGM_MAX_TEST_PARMS_LEN_V2 * DCGM_MAX_TEST_PARMS),
        ("fakeGpuList", c_char * DCGM_GPU_LIST_LEN),
        ("debugLogFile", c_char * DCGM_PATH_LEN),
        ("statsPath", c_char * DCGM_PATH_LEN),
        ("configFileContents", c_char * DCGM_MAX_CONFIG_FILE_LEN),
        ("clocksEventMask", c_char * DCGM_CLOCKS_EVENT_MASK_LEN),
        ("pluginPath", c_char * DCGM_PATH_LEN),
        ("currentIterations", c_uint),
        ("totalIterations", c_uint),
        ("timeoutSeconds", c_uint),
        ("_unusedBuf", c_char * DCGM_PATH_LEN),
        ("failCheckInterval", c_uint),
        ("expectedNumEntities", c_char * DCGM_EXPECTED_ENTITIES_LEN),
        ("entityIds", c_char * DCGM_ENTITY_ID_LIST_LEN),  # e.g. "0,1" or "*,cpu:*"
        ("watchFrequency", c_uint),
        ("ignoreErrorCodes", c_char * DCGM_IGNORE_ERROR_MAX_LEN),
    ]


dcgmRunDiag_version10 = make_dcgm_version(c_dcgmRunDiag_v10, 10)

c_dcgmRunDiag_t = c_dcgmRunDiag_v10
dcgmRunDiag_version = dcgmRunDiag_version10

DCGM_GEGE_FLAG_ONLY_SUPPORTED = 0x00000001


## Version info
class c_dcgmVersionInfo_v2(_PrintableStructure):
    _fields_ = [
        ("version", c_uint32),
        ("rawBuildInfoString", c_char * (DCGM_MAX_STR_LENGTH * 2)),
    ]


dcgmVersionInfo_version2 = make_dcgm_version(c_dcgmVersionInfo_v2, 2)
dcgmVersionInfo_version = dcgmVersionInfo_version2
