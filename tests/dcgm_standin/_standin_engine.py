"""Fake DCGM host engine behind the stand-in bindings, and the control API tests drive it with.

Not part of DCGM: no real binding has a module of this name. The binding modules in this
directory call into `Library` (what dcgm_structs._LoadDcgmLibrary "loads"), exactly where the
real ones call libdcgm.so.4.

State shared across processes lives in a JSON file named by $GPUAGENT_DCGM_STANDIN_STATE
(re-read whenever it changes; written atomically by `Control`). Without the variable the engine
runs on a built-in default (two GPUs, everything healthy) that cannot be changed. Calls are
appended to "<state file>.calls.jsonl" (one JSON object per line), so a test can see what an
agent in another process did and in which order.

Per-process host-engine objects (connections, groups, field groups, watches, health systems,
policies, policy registrations) live in this module. A host-engine restart (new "generation"
in the state) invalidates every connection made before it: calls on those handles fail with
DCGM_ST_CONNECTION_NOT_VALID until the client connects again, and their registrations are gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import itertools
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path

STATE_ENV = "GPUAGENT_DCGM_STANDIN_STATE"
DCGM_VERSION = "4.5.0"
HERE = Path(__file__).resolve().parent

# --- status codes and constants the engine needs (same values as dcgm_structs) ---------------
ST_OK = 0
ST_BADPARAM = -1
ST_NOT_CONFIGURED = -5
ST_NOT_SUPPORTED = -6
ST_VER_MISMATCH = -12
ST_NO_DATA = -14
ST_NOT_WATCHED = -16
ST_CONNECTION_NOT_VALID = -21
ST_MODULE_NOT_LOADED = -33
ST_GROUP_IS_EMPTY = -35
ST_PROFILING_NOT_SUPPORTED = -36
ST_NVML_NOT_LOADED = -56
FE_NONE = 0
FE_GPU = 1
GROUP_ALL_GPUS = 0x7FFFFFFF
GROUP_NULL = 0x7FFFFFFA
GROUP_DEFAULT = 0
GROUP_EMPTY = 1
DIAG_SYSTEM_ERROR = 0x70  # DCGM_DIAG_RESPONSE_SYSTEM_ERROR
FV_FLAG_LIVE_DATA = 0x1

INT64_BLANK = 0x7FFFFFFFFFFFFFF0
INT64_NOT_SUPPORTED = INT64_BLANK + 2
FP64_BLANK = 140737488355328.0
FP64_NOT_SUPPORTED = FP64_BLANK + 2.0
STR_BLANK = "<<<NULL>>>"
STR_NOT_SUPPORTED = "<<<NOT_SUPPORTED>>>"

OUTCOMES = {"pass": 0, "skip": 1, "warn": 2, "fail": 3, "notrun": 4}
_RESULT_RANK = {3: 4, 2: 3, 0: 2, 1: 1, 4: 0}  # fail > warn > pass > skip > not run

# Diagnostic tests of each level, their plugin, and their category.
DIAG_LEVEL_TESTS = {
    1: ["software"],
    2: ["software", "pcie", "memory"],
    3: [
        "software",
        "pcie",
        "memory",
        "diagnostic",
        "targeted_stress",
        "targeted_power",
        "memory_bandwidth",
    ],
    4: [
        "software",
        "pcie",
        "memory",
        "diagnostic",
        "targeted_stress",
        "targeted_power",
        "memory_bandwidth",
        "memtest",
        "pulse_test",
    ],
}
DIAG_CATEGORIES = ["Deployment", "Integration", "Hardware", "Stress"]
_TEST_CATEGORY = {"software": 0, "pcie": 1, "memory": 2, "diagnostic": 2, "memtest": 2}

# Field metadata served by DcgmFieldGetById/ByTag: id -> (tag, type, entity level).
_S, _I, _D = "s", "i", "d"
FIELD_META: dict[int, tuple[str, str, int]] = {
    1: ("driver_version", _S, FE_NONE),
    2: ("nvml_version", _S, FE_NONE),
    3: ("process_name", _S, FE_NONE),
    4: ("device_count", _I, FE_NONE),
    5: ("cuda_driver_version", _I, FE_NONE),
    50: ("name", _S, FE_GPU),
    51: ("brand", _S, FE_GPU),
    52: ("nvml_index", _I, FE_GPU),
    53: ("serial_number", _S, FE_GPU),
    54: ("uuid", _S, FE_GPU),
    55: ("minor_number", _I, FE_GPU),
    57: ("pci_busid", _S, FE_GPU),
    58: ("pci_combined_id", _I, FE_GPU),
    59: ("pci_subsys_id", _I, FE_GPU),
    85: ("vbios_version", _S, FE_GPU),
    100: ("sm_clock", _I, FE_GPU),
    101: ("memory_clock", _I, FE_GPU),
    102: ("video_clock", _I, FE_GPU),
    110: ("sm_app_clock", _I, FE_GPU),
    111: ("mem_app_clock", _I, FE_GPU),
    112: ("current_clocks_event_reasons", _I, FE_GPU),
    140: ("memory_temp", _I, FE_GPU),
    150: ("gpu_temp", _I, FE_GPU),
    155: ("power_usage", _D, FE_GPU),
    156: ("total_energy_consumption", _I, FE_GPU),
    157: ("power_usage_instant", _D, FE_GPU),
    160: ("power_management_limit", _D, FE_GPU),
    164: ("enforced_power_limit", _D, FE_GPU),
    190: ("pstate", _I, FE_GPU),
    191: ("fan_speed", _I, FE_GPU),
    200: ("pcie_tx_throughput", _I, FE_GPU),
    201: ("pcie_rx_throughput", _I, FE_GPU),
    202: ("pcie_replay_counter", _I, FE_GPU),
    203: ("gpu_utilization", _I, FE_GPU),
    204: ("mem_copy_utilization", _I, FE_GPU),
    206: ("enc_utilization", _I, FE_GPU),
    207: ("dec_utilization", _I, FE_GPU),
    230: ("xid_errors", _I, FE_GPU),
    235: ("pcie_max_link_gen", _I, FE_GPU),
    236: ("pcie_max_link_width", _I, FE_GPU),
    237: ("pcie_link_gen", _I, FE_GPU),
    238: ("pcie_link_width", _I, FE_GPU),
    240: ("power_violation", _I, FE_GPU),
    241: ("thermal_violation", _I, FE_GPU),
    250: ("fb_total", _I, FE_GPU),
    251: ("fb_free", _I, FE_GPU),
    252: ("fb_used", _I, FE_GPU),
    253: ("fb_resv", _I, FE_GPU),
    300: ("ecc", _I, FE_GPU),
    301: ("ecc_pending", _I, FE_GPU),
    310: ("ecc_sbe_volatile_total", _I, FE_GPU),
    311: ("ecc_dbe_volatile_total", _I, FE_GPU),
    312: ("ecc_sbe_aggregate_total", _I, FE_GPU),
    313: ("ecc_dbe_aggregate_total", _I, FE_GPU),
    390: ("retired_pages_sbe", _I, FE_GPU),
    391: ("retired_pages_dbe", _I, FE_GPU),
    392: ("retired_pages_pending", _I, FE_GPU),
    393: ("uncorrectable_remapped_rows", _I, FE_GPU),
    394: ("correctable_remapped_rows", _I, FE_GPU),
    395: ("row_remap_failure", _I, FE_GPU),
    396: ("row_remap_pending", _I, FE_GPU),
    409: ("nvlink_flit_crc_error_count_total", _I, FE_GPU),
    419: ("nvlink_data_crc_error_count_total", _I, FE_GPU),
    429: ("nvlink_replay_error_count_total", _I, FE_GPU),
    439: ("nvlink_recovery_error_count_total", _I, FE_GPU),
    449: ("nvlink_bandwidth_total", _I, FE_GPU),
    1001: ("gr_engine_active", _D, FE_GPU),
    1002: ("sm_active", _D, FE_GPU),
    1003: ("sm_occupancy", _D, FE_GPU),
    1004: ("tensor_active", _D, FE_GPU),
    1005: ("dram_active", _D, FE_GPU),
    1006: ("fp64_active", _D, FE_GPU),
    1007: ("fp32_active", _D, FE_GPU),
    1008: ("fp16_active", _D, FE_GPU),
    1009: ("pcie_tx_bytes", _I, FE_GPU),
    1010: ("pcie_rx_bytes", _I, FE_GPU),
    1011: ("nvlink_tx_bytes", _I, FE_GPU),
    1012: ("nvlink_rx_bytes", _I, FE_GPU),
    1013: ("tensor_imma_active", _D, FE_GPU),
    1014: ("tensor_hmma_active", _D, FE_GPU),
    1015: ("tensor_dfma_active", _D, FE_GPU),
    1016: ("integer_active", _D, FE_GPU),
}
MAX_FIELD_ID = 1503


def is_profiling_field(field_id: int) -> bool:
    return 1001 <= field_id <= 1083


# --- shared state ------------------------------------------------------------------------------


def default_gpu(
    index: int, *, profiling: bool = True, model: str = "NVIDIA H100 80GB HBM3"
) -> dict:
    return {
        "index": index,
        "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        "uuid": f"GPU-{index:08x}-5a1d-4c2e-9b7f-00000000{index:04x}",
        "model": model,
        "serial": f"165322{index:07d}",
        "sku": "2330",
        "profiling": profiling,
    }


def default_state() -> dict:
    return {
        "library": True,
        "engine": {"up": True, "generation": 1, "address": None, "unix_socket": None},
        "driver": {
            "version": "570.133.20",
            "attached": True,
            "detach_available": True,
            "detach_status": 0,
            "attach_status": 0,
        },
        "profiling_module_loaded": True,
        "gpus": [default_gpu(0), default_gpu(1)],
        "incidents": [],
        "violations": [],
        "next_seq": 1,
        "fields": {},
        "diag": {"error": None, "duration_s": 0.0, "tests": {}, "levels": {}},
    }


_DEFAULT_STATE = default_state()
_state_lock = threading.RLock()
_state_cache: dict[str, tuple[tuple[int, int, int], dict]] = {}


def _state_path() -> str | None:
    return os.environ.get(STATE_ENV) or None


def read_state(path: str | None = None) -> dict:
    """The current state (re-read when the file changed)."""
    path = path or _state_path()
    if path is None:
        return _DEFAULT_STATE
    with _state_lock:
        st = os.stat(path)
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = _state_cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        _state_cache[path] = (key, state)
        return state


@contextlib.contextmanager
def _locked(path: str):
    with open(path + ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_state(path: str, state: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".standin-", dir=os.path.dirname(path) or ".")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def update_state(mutate, path: str | None = None) -> dict:
    """Read-modify-write the state under a file lock; returns the new state."""
    path = path or _state_path()
    if path is None:
        mutate(_DEFAULT_STATE)
        return _DEFAULT_STATE
    with _locked(path):
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        mutate(state)
        _write_state(path, state)
    return state


# --- call log ------------------------------------------------------------------------------

_memory_calls: list[dict] = []


def _calls_path(state_path: str | None) -> str | None:
    return state_path + ".calls.jsonl" if state_path else None


def record(fn: str, **details) -> None:
    entry = {
        "fn": fn,
        "t": time.time(),
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        **details,
    }
    path = _calls_path(_state_path())
    if path is None:
        _memory_calls.append(entry)
        return
    line = json.dumps(entry, default=str) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def _summarise(arg):
    if arg is None or isinstance(arg, (bool, int, float, str)):
        return arg
    if isinstance(arg, bytes):
        return arg.decode("utf-8", "replace")
    if isinstance(arg, ctypes._SimpleCData):
        value = arg.value
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if isinstance(arg, ctypes._CFuncPtr):
        return "<callback>"
    if type(arg).__name__ == "CArgObject":
        return "&" + type(arg._obj).__name__
    return type(arg).__name__


# --- per-process host-engine objects -----------------------------------------------------------


class _Status(Exception):
    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class _Conn:
    def __init__(self, handle: int, *, embedded: bool, generation: int, address: str | None):
        self.handle = handle
        self.embedded = embedded
        self.generation = generation
        self.address = address
        self.groups: dict[int, dict] = {}
        self.field_groups: dict[int, dict] = {}
        self.watches: list[dict] = []
        self.health: dict[int, int] = {}
        self.policies: dict[int, dict] = {}


class _Registration:
    def __init__(self, conn, group_id, condition, callback, user_data, seen_seq):
        self.conn = conn
        self.group_id = group_id
        self.condition = condition
        self.callback_ref = weakref.ref(callback)
        self.callback_type = type(callback).__name__
        self.user_data = user_data  # the py_object passed in; kept alive while registered
        self.seen_seq = seen_seq


_proc_lock = threading.RLock()
_conns: dict[int, _Conn] = {}
_registrations: list[_Registration] = []
_statuses: dict[int, list] = {}
_ids = itertools.count(0x51)
_wake = threading.Event()
_thread: threading.Thread | None = None


def _now_us() -> int:
    return int(time.time() * 1_000_000)


def _val(x) -> int:
    """The integer value of a handle/id argument (c_void_p, c_int, int or None)."""
    if x is None:
        return 0
    if isinstance(x, ctypes._SimpleCData):
        x = x.value
    return int(x or 0)


def _out(ref):
    """The object behind byref()/pointer() arguments."""
    return ref._obj if type(ref).__name__ == "CArgObject" else ref


def _conn_valid(conn: _Conn, state: dict) -> bool:
    if conn.embedded:
        return True
    engine = state["engine"]
    return bool(engine["up"]) and engine["generation"] == conn.generation


def _gpus(state: dict) -> list[dict]:
    return list(state["gpus"]) if state["driver"]["attached"] else []


def _gpu(state: dict, gpu_id: int) -> dict | None:
    return next((g for g in _gpus(state) if g["index"] == gpu_id), None)


def reset_process() -> None:
    """Forget this process's connections, registrations and loaded "library" (for tests that
    run the bindings in the test process itself)."""
    import sys  # noqa: PLC0415

    with _proc_lock:
        _conns.clear()
        _registrations.clear()
        _statuses.clear()
        _memory_calls.clear()
    with _state_lock:
        _state_cache.clear()
    structs = sys.modules.get("dcgm_structs")
    if structs is not None:
        structs.dcgmLib = None
        structs._dcgmGetFunctionPointer_cache.clear()
        structs._dcgmLib_refcount = 0


def load_library(lib_path=None):
    """What dcgm_structs._LoadDcgmLibrary finds: a Library, or None when DCGM is "not installed"."""
    state = read_state()
    record("_LoadDcgmLibrary", libDcgmPath=lib_path, found=bool(state.get("library", True)))
    if not state.get("library", True):
        return None
    return Library()


def _api(fn):
    """Library entry point: record the call, turn _Status into the returned code."""
    name = fn.__name__

    def wrapper(self, *args):
        details: dict = {}
        try:
            ret = fn(self, details, *args)
        except _Status as e:
            ret = e.code
        record(name, args=[_summarise(a) for a in args], ret=ret, **details)
        return ret

    wrapper.__name__ = name
    return wrapper


class _Function:
    """A library function object the bindings may set .restype on, as on a ctypes function."""

    def __init__(self, fn):
        self._fn = fn
        self.restype = None

    def __call__(self, *args):
        return self._fn(*args)


class Library:
    """The fake libdcgm: C entry points with the real names and argument order, taking the
    ctypes arguments the bindings pass and returning dcgmReturn_t codes."""

    def __getattr__(self, name):
        # Symbols missing from this libdcgm (AttributeError -> DCGMError_FunctionNotFound).
        raise AttributeError(name)

    def __getattribute__(self, name):
        if name in ("dcgmDetachDriver", "dcgmAttachDriver"):
            if not read_state()["driver"].get("detach_available", True):
                raise AttributeError(name)
        if name in ("DcgmFieldGetById", "DcgmFieldGetByTag"):
            return _Function(object.__getattribute__(self, name))
        return object.__getattribute__(self, name)

    # --- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _conn(handle) -> tuple[_Conn, dict]:
        state = read_state()
        with _proc_lock:
            conn = _conns.get(_val(handle))
        if conn is None:
            raise _Status(ST_BADPARAM)
        if not _conn_valid(conn, state):
            raise _Status(ST_CONNECTION_NOT_VALID)
        return conn, state

    @staticmethod
    def _group_gpus(conn: _Conn, state: dict, group_id) -> list[int]:
        gid = _val(group_id)
        present = [g["index"] for g in _gpus(state)]
        if gid in (0, GROUP_ALL_GPUS):
            return present
        group = conn.groups.get(gid)
        if group is None:
            raise _Status(ST_NOT_CONFIGURED)
        if group["all"]:
            return present
        return [g for g in group["gpus"] if g in present]

    @staticmethod
    def _new_handle(embedded: bool, state: dict, address: str | None) -> int:
        with _proc_lock:
            handle = next(_ids)
            _conns[handle] = _Conn(
                handle,
                embedded=embedded,
                generation=state["engine"]["generation"],
                address=address,
            )
        return handle

    # --- init / connect ----------------------------------------------------------------------
    @_api
    def dcgmInit(self, details, handle_ref):
        return ST_OK

    @_api
    def dcgmShutdown(self, details):
        return ST_OK

    def dcgmErrorString(self, result):
        return "Unknown Error"

    @_api
    def dcgmStartEmbedded(self, details, op_mode, handle_ref):
        if _val(op_mode) not in (1, 2):
            raise _Status(ST_BADPARAM)
        state = read_state()
        _out(handle_ref).value = self._new_handle(True, state, None)
        details["handle"] = _out(handle_ref).value
        return ST_OK

    @_api
    def dcgmStopEmbedded(self, details, handle):
        with _proc_lock:
            conn = _conns.pop(_val(handle), None)
        if conn is None:
            raise _Status(ST_BADPARAM)
        self._drop_registrations(conn)
        return ST_OK

    def _connect(self, details, address, unix_socket: bool, handle_ref):
        state = read_state()
        engine = state["engine"]
        addr = _summarise(address)
        details.update(address=addr, unix_socket=unix_socket)
        if not engine["up"]:
            raise _Status(ST_CONNECTION_NOT_VALID)
        expected = engine.get("unix_socket") if unix_socket else engine.get("address")
        if expected and expected != addr:
            raise _Status(ST_CONNECTION_NOT_VALID)
        _out(handle_ref).value = self._new_handle(False, state, addr)
        details["handle"] = _out(handle_ref).value
        return ST_OK

    @_api
    def dcgmConnect(self, details, address, handle_ref):
        return self._connect(details, address, False, handle_ref)

    @_api
    def dcgmConnect_v2(self, details, address, params_ref, handle_ref):
        import dcgm_structs  # noqa: PLC0415

        params = _out(params_ref)
        if params.version not in (
            dcgm_structs.c_dcgmConnectV2Params_version1,
            dcgm_structs.c_dcgmConnectV2Params_version2,
        ):
            raise _Status(ST_VER_MISMATCH)
        unix = bool(getattr(params, "addressIsUnixSocket", 0))
        return self._connect(details, address, unix, handle_ref)

    @_api
    def dcgmDisconnect(self, details, handle):
        with _proc_lock:
            conn = _conns.pop(_val(handle), None)
        if conn is None:
            raise _Status(ST_BADPARAM)
        self._drop_registrations(conn)
        return ST_OK

    @staticmethod
    def _drop_registrations(conn):
        with _proc_lock:
            _registrations[:] = [r for r in _registrations if r.conn is not conn]

    @_api
    def dcgmVersionInfo(self, details, info_ref):
        import dcgm_structs  # noqa: PLC0415

        info = _out(info_ref)
        if info.version != dcgm_structs.dcgmVersionInfo_version2:
            raise _Status(ST_VER_MISMATCH)
        info.rawBuildInfoString = (
            f"version:{DCGM_VERSION};arch:x86_64;buildtype:Release;buildid:;"
            "builddate:2025-09-30;commit:0000000;branch:rel_dcgm_4_5;buildplatform:Linux;;"
            "crc:00000000000000000000000000000000"
        )
        return ST_OK

    @_api
    def dcgmHostengineIsHealthy(self, details, handle, health_ref):
        self._conn(handle)
        _out(health_ref).overallHealth = 0
        return ST_OK

    # --- devices -----------------------------------------------------------------------------
    def _fill_gpu_ids(self, handle, ids, count_ref):
        _conn, state = self._conn(handle)
        gpus = _gpus(state)
        for i, g in enumerate(gpus):
            ids[i] = g["index"]
        _out(count_ref).value = len(gpus)
        return ST_OK

    @_api
    def dcgmGetAllSupportedDevices(self, details, handle, ids, count_ref):
        return self._fill_gpu_ids(handle, ids, count_ref)

    @_api
    def dcgmGetAllDevices(self, details, handle, ids, count_ref):
        return self._fill_gpu_ids(handle, ids, count_ref)

    @_api
    def dcgmGetDeviceAttributes(self, details, handle, gpu_id, attrs_ref):
        _conn, state = self._conn(handle)
        gpu = _gpu(state, _val(gpu_id))
        if gpu is None:
            raise _Status(ST_BADPARAM)
        attrs = _out(attrs_ref)
        ident = attrs.identifiers
        ident.brandName = gpu.get("brand", "NVIDIA")
        ident.deviceName = gpu["model"]
        ident.pciBusId = gpu["pci_bus_id"]
        ident.serial = gpu.get("serial", "")
        ident.uuid = gpu["uuid"]
        ident.vbios = gpu.get("vbios", "96.00.74.00.01")
        ident.inforomImageVersion = gpu.get("inforom", "G520.0200.00.05")
        ident.pciDeviceId = int(gpu.get("pci_device_id", 0x233010DE))
        ident.pciSubSystemId = int(gpu.get("pci_subsystem_id", 0x16C110DE))
        ident.driverVersion = state["driver"]["version"]
        attrs.memoryUsage.fbTotal = int(gpu.get("fb_total_mib", 81559))
        attrs.thermalSettings.slowdownTemp = 87
        attrs.thermalSettings.shutdownTemp = 92
        attrs.powerLimits.curPowerLimit = 700
        attrs.powerLimits.defaultPowerLimit = 700
        attrs.powerLimits.enforcedPowerLimit = 700
        attrs.powerLimits.minPowerLimit = 200
        attrs.powerLimits.maxPowerLimit = 700
        attrs.settings.persistenceModeEnabled = 1
        return ST_OK

    # --- groups ------------------------------------------------------------------------------
    @_api
    def dcgmGroupCreate(self, details, handle, group_type, name, group_ref):
        conn, _state = self._conn(handle)
        gtype = _val(group_type)
        if gtype not in (GROUP_DEFAULT, GROUP_EMPTY):
            raise _Status(ST_NOT_SUPPORTED)
        with _proc_lock:
            gid = next(_ids)
        conn.groups[gid] = {"name": _summarise(name), "all": gtype == GROUP_DEFAULT, "gpus": []}
        _out(group_ref).value = gid
        details["group"] = gid
        return ST_OK

    @_api
    def dcgmGroupDestroy(self, details, handle, group_id):
        conn, _state = self._conn(handle)
        gid = _val(group_id)
        if conn.groups.pop(gid, None) is None:
            raise _Status(ST_NOT_CONFIGURED)
        conn.watches = [w for w in conn.watches if w["group"] != gid]
        conn.health.pop(gid, None)
        with _proc_lock:
            _registrations[:] = [
                r for r in _registrations if not (r.conn is conn and r.group_id == gid)
            ]
        return ST_OK

    def _editable_group(self, handle, group_id):
        conn, state = self._conn(handle)
        group = conn.groups.get(_val(group_id))
        if group is None or group["all"]:
            raise _Status(ST_NOT_CONFIGURED)
        return group, state

    @_api
    def dcgmGroupAddDevice(self, details, handle, group_id, gpu_id):
        group, state = self._editable_group(handle, group_id)
        gid = _val(gpu_id)
        if _gpu(state, gid) is None:
            raise _Status(ST_BADPARAM)
        if gid not in group["gpus"]:
            group["gpus"].append(gid)
        return ST_OK

    @_api
    def dcgmGroupAddEntity(self, details, handle, group_id, entity_group, entity_id):
        if _val(entity_group) != FE_GPU:
            raise _Status(ST_NOT_SUPPORTED)
        group, state = self._editable_group(handle, group_id)
        gid = _val(entity_id)
        if _gpu(state, gid) is None:
            raise _Status(ST_BADPARAM)
        if gid not in group["gpus"]:
            group["gpus"].append(gid)
        return ST_OK

    @_api
    def dcgmGroupRemoveDevice(self, details, handle, group_id, gpu_id):
        group, _state = self._editable_group(handle, group_id)
        if _val(gpu_id) not in group["gpus"]:
            raise _Status(ST_BADPARAM)
        group["gpus"].remove(_val(gpu_id))
        return ST_OK

    @_api
    def dcgmGroupGetInfo(self, details, handle, group_id, info_ref):
        conn, state = self._conn(handle)
        gpus = self._group_gpus(conn, state, group_id)
        info = _out(info_ref)
        group = conn.groups.get(_val(group_id))
        info.groupName = group["name"] if group else "DCGM_ALL_SUPPORTED_GPUS"
        info.count = len(gpus)
        for i, g in enumerate(gpus):
            info.entityList[i].entityGroupId = FE_GPU
            info.entityList[i].entityId = g
        return ST_OK

    @_api
    def dcgmGroupGetAllIds(self, details, handle, ids, count_ref):
        conn, _state = self._conn(handle)
        for i, gid in enumerate(conn.groups):
            ids[i] = gid
        _out(count_ref).value = len(conn.groups)
        return ST_OK

    # --- field groups and watches ------------------------------------------------------------
    @_api
    def dcgmFieldGroupCreate(self, details, handle, num, ids_ref, name, fg_ref):
        conn, _state = self._conn(handle)
        count = _val(num)
        if count <= 0 or count > 128:
            raise _Status(ST_BADPARAM)
        field_ids = list(_out(ids_ref)[:count])
        if any(f <= 0 or f > MAX_FIELD_ID for f in field_ids):
            raise _Status(ST_BADPARAM)
        with _proc_lock:
            fgid = next(_ids)
        conn.field_groups[fgid] = {"name": _summarise(name), "fields": field_ids}
        _out(fg_ref).value = fgid
        details.update(field_group=fgid, fields=field_ids)
        return ST_OK

    @_api
    def dcgmFieldGroupDestroy(self, details, handle, fg_id):
        conn, _state = self._conn(handle)
        fgid = _val(fg_id)
        if conn.field_groups.pop(fgid, None) is None:
            raise _Status(ST_NO_DATA)
        conn.watches = [w for w in conn.watches if w["field_group"] != fgid]
        return ST_OK

    def _fill_fg_info(self, info, fgid, fg):
        info.fieldGroupId = fgid
        info.fieldGroupName = fg["name"]
        info.numFieldIds = len(fg["fields"])
        for i, f in enumerate(fg["fields"]):
            info.fieldIds[i] = f

    @_api
    def dcgmFieldGroupGetInfo(self, details, handle, info_ref):
        conn, _state = self._conn(handle)
        info = _out(info_ref)
        fgid = _val(info.fieldGroupId)
        fg = conn.field_groups.get(fgid)
        if fg is None:
            raise _Status(ST_NO_DATA)
        self._fill_fg_info(info, fgid, fg)
        return ST_OK

    @_api
    def dcgmFieldGroupGetAll(self, details, handle, all_ref):
        conn, _state = self._conn(handle)
        out = _out(all_ref)
        out.numFieldGroups = len(conn.field_groups)
        for i, (fgid, fg) in enumerate(conn.field_groups.items()):
            self._fill_fg_info(out.fieldGroups[i], fgid, fg)
        return ST_OK

    @_api
    def dcgmWatchFields(self, details, handle, group_id, fg_id, freq, keep_age, keep_samples):
        conn, state = self._conn(handle)
        gpus = self._group_gpus(conn, state, group_id)
        fg = conn.field_groups.get(_val(fg_id))
        if fg is None:
            raise _Status(ST_BADPARAM)
        if any(is_profiling_field(f) for f in fg["fields"]):
            if not state.get("profiling_module_loaded", True):
                raise _Status(ST_MODULE_NOT_LOADED)
            if any(not _gpu(state, g).get("profiling", True) for g in gpus):
                raise _Status(ST_PROFILING_NOT_SUPPORTED)
        freq_us = max(int(_val(freq)), 1)
        conn.watches = [
            w
            for w in conn.watches
            if not (w["group"] == _val(group_id) and w["field_group"] == _val(fg_id))
        ]
        conn.watches.append(
            {
                "group": _val(group_id),
                "field_group": _val(fg_id),
                "fields": list(fg["fields"]),
                "freq_us": freq_us,
                "since_us": _now_us(),
                "updated_us": None,
            }
        )
        details.update(group=_val(group_id), fields=fg["fields"], update_freq_us=freq_us)
        return ST_OK

    @_api
    def dcgmUnwatchFields(self, details, handle, group_id, fg_id):
        conn, _state = self._conn(handle)
        conn.watches = [
            w
            for w in conn.watches
            if not (w["group"] == _val(group_id) and w["field_group"] == _val(fg_id))
        ]
        return ST_OK

    @_api
    def dcgmUpdateAllFields(self, details, handle, wait):
        conn, _state = self._conn(handle)
        now = _now_us()
        for w in conn.watches:
            w["updated_us"] = now
        return ST_OK

    def _sample_ts(self, conn, state, gpu_id, field_id) -> int | None:
        """Timestamp of the latest sample of a watched (gpu, field), None when unwatched,
        0 when watched but not sampled yet."""
        best = None
        now = _now_us()
        for w in conn.watches:
            if field_id not in w["fields"]:
                continue
            try:
                gpus = self._group_gpus(conn, state, w["group"])
            except _Status:
                continue
            if gpu_id not in gpus:
                continue
            ticks = (now - w["since_us"]) // w["freq_us"]
            ts = w["since_us"] + ticks * w["freq_us"] if ticks > 0 else 0
            if w["updated_us"] is not None:
                ts = max(ts, w["updated_us"])
            best = ts if best is None else max(best, ts)
        return best

    @staticmethod
    def _fill_value(fv, state, gpu_id, field_id, status, ts):
        tag_type = FIELD_META.get(field_id, ("", _I, FE_GPU))[1]
        fv.fieldId = field_id
        fv.fieldType = ord(tag_type)
        fv.ts = ts
        gpu = _gpu(state, gpu_id)
        unsupported = gpu is None or (is_profiling_field(field_id) and not gpu.get("profiling"))
        value = state.get("fields", {}).get(str(gpu_id), {}).get(str(field_id))
        if status == ST_OK and gpu is not None and value is None and not unsupported:
            value = _builtin_value(state, gpu, field_id)
        if tag_type == _D:
            if unsupported:
                fv.value.dbl = FP64_NOT_SUPPORTED
            else:
                fv.value.dbl = FP64_BLANK if value is None or status else float(value)
        elif tag_type == _S:
            if unsupported:
                fv.value.str = STR_NOT_SUPPORTED
            else:
                fv.value.str = STR_BLANK if value is None or status else str(value)
        elif unsupported:
            fv.value.i64 = INT64_NOT_SUPPORTED
        else:
            fv.value.i64 = INT64_BLANK if value is None or status else int(value)
        fv.status = status

    def _cached_value(self, fv, conn, state, gpu_id, field_id, live=False):
        import dcgm_structs  # noqa: PLC0415

        fv.version = (
            dcgm_structs.dcgmFieldValue_version2
            if isinstance(fv, dcgm_structs.c_dcgmFieldValue_v2)
            else dcgm_structs.dcgmFieldValue_version1
        )
        if live:
            self._fill_value(fv, state, gpu_id, field_id, ST_OK, _now_us())
            return _now_us()
        ts = self._sample_ts(conn, state, gpu_id, field_id)
        if ts is None:
            self._fill_value(fv, state, gpu_id, field_id, ST_NOT_WATCHED, 0)
        elif ts == 0:
            self._fill_value(fv, state, gpu_id, field_id, ST_NO_DATA, 0)
        else:
            self._fill_value(fv, state, gpu_id, field_id, ST_OK, ts)
        return ts

    def _enumerate(self, handle, group_id, fg_id, callback, user_data, *, entity, since=None):
        import dcgm_structs  # noqa: PLC0415

        conn, state = self._conn(handle)
        gpus = self._group_gpus(conn, state, group_id)
        fg = conn.field_groups.get(_val(fg_id))
        if fg is None:
            raise _Status(ST_BADPARAM)
        user = id(user_data.value) if isinstance(user_data, ctypes.py_object) else user_data
        for gpu_id in gpus:
            values = []
            for field_id in fg["fields"]:
                fv = dcgm_structs.c_dcgmFieldValue_v1()
                ts = self._cached_value(fv, conn, state, gpu_id, field_id)
                if since is None or (ts and ts > since and fv.status == ST_OK):
                    values.append(fv)
            if not values:
                continue
            array = (dcgm_structs.c_dcgmFieldValue_v1 * len(values))(*values)
            if entity:
                rc = callback(FE_GPU, gpu_id, array, len(values), user)
            else:
                rc = callback(gpu_id, array, len(values), user)
            if rc:
                break
        return ST_OK

    @_api
    def dcgmGetLatestValues(self, details, handle, group_id, fg_id, callback, user_data):
        return self._enumerate(handle, group_id, fg_id, callback, user_data, entity=False)

    @_api
    def dcgmGetLatestValues_v2(self, details, handle, group_id, fg_id, callback, user_data):
        return self._enumerate(handle, group_id, fg_id, callback, user_data, entity=True)

    @_api
    def dcgmGetValuesSince(self, details, handle, group_id, fg_id, since, next_ref, cb, ud):
        now = _now_us()
        self._enumerate(handle, group_id, fg_id, cb, ud, entity=False, since=_val(since))
        _out(next_ref).value = now
        return ST_OK

    @_api
    def dcgmGetValuesSince_v2(self, details, handle, group_id, fg_id, since, next_ref, cb, ud):
        now = _now_us()
        self._enumerate(handle, group_id, fg_id, cb, ud, entity=True, since=_val(since))
        _out(next_ref).value = now
        return ST_OK

    @_api
    def dcgmEntityGetLatestValues(self, details, handle, entity_group, entity_id, ids, n, out):
        conn, state = self._conn(handle)
        if _val(entity_group) != FE_GPU:
            raise _Status(ST_NOT_SUPPORTED)
        for i in range(_val(n)):
            self._cached_value(out[i], conn, state, _val(entity_id), ids[i])
        return ST_OK

    @_api
    def dcgmEntitiesGetLatestValues(self, details, handle, pairs, n, ids, nf, flags, out):
        conn, state = self._conn(handle)
        live = bool(_val(flags) & FV_FLAG_LIVE_DATA)
        k = 0
        for e in range(_val(n)):
            pair = pairs[e]
            for f in range(_val(nf)):
                fv = out[k]
                k += 1
                fv.entityGroupId = pair.entityGroupId
                fv.entityId = pair.entityId
                if pair.entityGroupId != FE_GPU:
                    fv.fieldId = ids[f]
                    fv.status = ST_NOT_SUPPORTED
                    continue
                self._cached_value(fv, conn, state, pair.entityId, ids[f], live=live)
        return ST_OK

    # --- field metadata ------------------------------------------------------------------------
    _meta_keep: dict = {}

    def DcgmFieldsInit(self):
        return 0

    def _meta(self, field_id):
        import dcgm_fields  # noqa: PLC0415

        entry = FIELD_META.get(field_id)
        if entry is None:
            return None
        meta = Library._meta_keep.get(field_id)
        if meta is None:
            meta = dcgm_fields.c_dcgm_field_meta_t()
            meta.fieldId = field_id
            meta.fieldType = entry[1].encode()
            meta.size = 0 if entry[1] == _S else 8
            meta.tag = entry[0]
            meta.scope = 0 if entry[2] == FE_NONE else 1
            meta.entityLevel = entry[2]
            Library._meta_keep[field_id] = meta
        return ctypes.pointer(meta)

    def DcgmFieldGetById(self, field_id):
        return self._meta(_val(field_id))

    def DcgmFieldGetByTag(self, tag):
        tag = _summarise(tag)
        return next((self._meta(f) for f, m in FIELD_META.items() if m[0] == tag), None)

    # --- status handles ----------------------------------------------------------------------
    def dcgmStatusCreate(self, handle_ref):
        with _proc_lock:
            sid = next(_ids)
            _statuses[sid] = []
        _out(handle_ref).value = sid
        return ST_OK

    def dcgmStatusDestroy(self, status):
        with _proc_lock:
            return ST_OK if _statuses.pop(_val(status), None) is not None else ST_BADPARAM

    def dcgmStatusGetCount(self, status, count_ref):
        _out(count_ref).value = len(_statuses.get(_val(status), []))
        return ST_OK

    def dcgmStatusPopError(self, status, info_ref):
        errors = _statuses.get(_val(status), [])
        if not errors:
            return ST_NO_DATA
        gpu_id, field_id, code = errors.pop(0)
        info = _out(info_ref)
        info.gpuId, info.fieldId, info.status = gpu_id, field_id, code
        return ST_OK

    def dcgmStatusClear(self, status):
        _statuses.get(_val(status), []).clear()
        return ST_OK

    # --- health ------------------------------------------------------------------------------
    @_api
    def dcgmHealthSet(self, details, handle, group_id, systems):
        conn, state = self._conn(handle)
        self._group_gpus(conn, state, group_id)
        conn.health[_val(group_id)] = _val(systems) & 0xFFFFFFFF
        details.update(group=_val(group_id), systems=conn.health[_val(group_id)])
        return ST_OK

    @_api
    def dcgmHealthSet_v2(self, details, handle, params_ref):
        params = _out(params_ref)
        conn, state = self._conn(handle)
        self._group_gpus(conn, state, params.groupId)
        conn.health[_val(params.groupId)] = params.systems & 0xFFFFFFFF
        details.update(group=_val(params.groupId), systems=params.systems)
        return ST_OK

    @_api
    def dcgmHealthGet(self, details, handle, group_id, systems_ref):
        conn, state = self._conn(handle)
        self._group_gpus(conn, state, group_id)
        _out(systems_ref).value = conn.health.get(_val(group_id), 0)
        return ST_OK

    @_api
    def dcgmHealthCheck(self, details, handle, group_id, response_ref):
        import dcgm_structs  # noqa: PLC0415

        conn, state = self._conn(handle)
        gpus = self._group_gpus(conn, state, group_id)
        response = _out(response_ref)
        if response.version != dcgm_structs.dcgmHealthResponse_version5:
            raise _Status(ST_VER_MISMATCH)
        systems = conn.health.get(_val(group_id), 0)
        incidents = [
            inc
            for inc in state.get("incidents", [])
            if inc["system"] & systems
            and (inc.get("entity_group", FE_GPU) != FE_GPU or inc["gpu"] in gpus)
        ][: dcgm_structs.DCGM_HEALTH_WATCH_MAX_INCIDENTS_V2]
        overall = 0
        for i, inc in enumerate(incidents):
            slot = response.incidents[i]
            slot.system = inc["system"]
            slot.health = inc["health"]
            slot.error.code = inc["code"]
            slot.error.msg = inc["message"]
            slot.entityInfo.entityGroupId = inc.get("entity_group", FE_GPU)
            slot.entityInfo.entityId = inc["gpu"]
            overall = max(overall, inc["health"])
        response.incidentCount = len(incidents)
        response.overallHealth = overall
        details.update(group=_val(group_id), systems=systems, incidents=len(incidents))
        return ST_OK

    # --- policy ------------------------------------------------------------------------------
    @_api
    def dcgmPolicySet(self, details, handle, group_id, policy_ref, status):
        import dcgm_structs  # noqa: PLC0415

        conn, state = self._conn(handle)
        gpus = self._group_gpus(conn, state, group_id)
        policy = _out(policy_ref)
        if policy.version != dcgm_structs.dcgmPolicy_version1:
            raise _Status(ST_VER_MISMATCH)
        stored = {
            "condition": policy.condition,
            "mode": policy.mode,
            "isolation": policy.isolation,
            "action": policy.action,
            "validation": policy.validation,
            "response": policy.response,
            "parms": [(p.tag, p.val.llval) for p in policy.parms],
        }
        for g in gpus:
            conn.policies[g] = stored
        details.update(group=_val(group_id), condition=policy.condition, gpus=gpus)
        return ST_OK

    @_api
    def dcgmPolicyGet(self, details, handle, group_id, count, policies, status):
        conn, state = self._conn(handle)
        gpus = self._group_gpus(conn, state, group_id)
        for i, g in enumerate(gpus[: _val(count)]):
            stored = conn.policies.get(g)
            if stored is None:
                continue
            out = policies[i]
            for key in ("condition", "mode", "isolation", "action", "validation", "response"):
                setattr(out, key, stored[key])
            for j, (tag, llval) in enumerate(stored["parms"]):
                out.parms[j].tag = tag
                out.parms[j].val.llval = llval
        return ST_OK

    @_api
    def dcgmPolicyRegister_v2(self, details, handle, group_id, condition, callback, user_data):
        conn, state = self._conn(handle)
        self._group_gpus(conn, state, group_id)
        if callback is None:
            raise _Status(ST_BADPARAM)
        if not isinstance(callback, ctypes._CFuncPtr):
            # What ctypes itself says when a foreign function gets a plain Python callable.
            raise ctypes.ArgumentError(
                "argument 4: TypeError: Don't know how to convert parameter 4"
            )
        reg = _Registration(
            conn,
            _val(group_id),
            _val(condition),
            callback,
            user_data,
            seen_seq=state.get("next_seq", 1) - 1,
        )
        with _proc_lock:
            _registrations.append(reg)
        details.update(group=_val(group_id), condition=_val(condition), callback=reg.callback_type)
        _ensure_policy_thread()
        return ST_OK

    @_api
    def dcgmPolicyUnregister(self, details, handle, group_id, condition):
        conn, _state = self._conn(handle)
        with _proc_lock:
            for reg in _registrations:
                if reg.conn is conn and reg.group_id == _val(group_id):
                    reg.condition &= ~_val(condition)
            _registrations[:] = [r for r in _registrations if r.condition]
        return ST_OK

    @_api
    def dcgmPolicyTrigger(self, details, handle):
        self._conn(handle)
        _wake.set()
        return ST_OK

    # --- diagnostics -------------------------------------------------------------------------
    @_api
    def dcgmActionValidate_v2(self, details, handle, run_ref, response_ref):
        import dcgm_structs  # noqa: PLC0415

        conn, state = self._conn(handle)
        info = _out(run_ref)
        expected = {
            dcgm_structs.c_dcgmRunDiag_v7: dcgm_structs.dcgmRunDiag_version7,
            dcgm_structs.c_dcgmRunDiag_v8: dcgm_structs.dcgmRunDiag_version8,
            dcgm_structs.c_dcgmRunDiag_v9: dcgm_structs.dcgmRunDiag_version9,
            dcgm_structs.c_dcgmRunDiag_v10: dcgm_structs.dcgmRunDiag_version10,
        }.get(type(info))
        if expected is None or info.version != expected:
            raise _Status(ST_VER_MISMATCH)
        gpus = self._diag_gpus(conn, state, info)
        names = [n.value.decode() for n in info.testNames if n.value]
        level = info.validate
        if names:
            tests = names
        elif level in DIAG_LEVEL_TESTS:
            tests = self._level_tests(state, level)
        else:
            raise _Status(ST_BADPARAM)
        details.update(level=level if not names else 0, gpus=gpus, tests=tests)
        return self._run_diag(state, gpus, tests, _out(response_ref))

    @_api
    def dcgmRunDiagnostic(self, details, handle, group_id, diag_level, response_ref):
        conn, state = self._conn(handle)
        level = {10: 1, 20: 2, 30: 3, 40: 4}.get(_val(diag_level))
        if level is None:
            raise _Status(ST_BADPARAM)
        gpus = self._group_gpus(conn, state, group_id)
        tests = self._level_tests(state, level)
        details.update(level=level, gpus=gpus, tests=tests)
        return self._run_diag(state, gpus, tests, _out(response_ref))

    @staticmethod
    def _level_tests(state, level):
        return list(state["diag"].get("levels", {}).get(str(level), DIAG_LEVEL_TESTS[level]))

    def _diag_gpus(self, conn, state, info):
        present = [g["index"] for g in _gpus(state)]
        listing = getattr(info, "entityIds", "") or getattr(info, "gpuList", "")
        if listing:
            chosen = []
            for token in (t.strip() for t in listing.split(",")):
                if not token or token.startswith("cpu:"):
                    continue
                if token in ("*", "gpu:*"):
                    chosen.extend(present)
                    continue
                token = token.removeprefix("gpu:")
                if not token.isdigit() or int(token) not in present:
                    raise _Status(ST_BADPARAM)
                chosen.append(int(token))
            return sorted(set(chosen))
        if _val(info.groupId) == GROUP_NULL:
            raise _Status(ST_BADPARAM)
        return self._group_gpus(conn, state, info.groupId)

    def _run_diag(self, state, gpus, tests, response):
        import dcgm_structs  # noqa: PLC0415

        if response.version != dcgm_structs.dcgmDiagResponse_version12:
            raise _Status(ST_VER_MISMATCH)
        diag = state["diag"]
        response.dcgmVersion = DCGM_VERSION
        response.dcgmDriverVersion = state["driver"]["version"]
        error = diag.get("error")
        if error is None and not state["driver"]["attached"]:
            error = {"status": ST_NVML_NOT_LOADED, "message": "The NVIDIA driver is detached."}
        if error is not None:
            err = response.errors[0]
            err.entity.entityGroupId = FE_NONE
            err.entity.entityId = 0
            err.code = int(error.get("code", 44))  # DCGM_FR_INTERNAL
            err.category = int(error.get("category", 16))  # DCGM_FR_EC_INTERNAL_OTHER
            err.severity = int(error.get("severity", 3))
            err.msg = error["message"]
            err.testId = DIAG_SYSTEM_ERROR
            response.numErrors = 1
            return int(error["status"])
        if not gpus:
            raise _Status(ST_GROUP_IS_EMPTY)
        if diag.get("duration_s"):
            time.sleep(float(diag["duration_s"]))
        for i, name in enumerate(DIAG_CATEGORIES):
            response.categories[i].value = name.encode()
        response.numCategories = len(DIAG_CATEGORIES)
        for i, g in enumerate(gpus):
            gpu = _gpu(state, g)
            response.entities[i].entity.entityGroupId = FE_GPU
            response.entities[i].entity.entityId = g
            response.entities[i].serialNum = gpu.get("serial", "")
            response.entities[i].skuDeviceId = gpu.get("sku", "2330")
        response.numEntities = len(gpus)
        n_results = n_errors = n_info = 0
        for t, name in enumerate(tests[: dcgm_structs.DCGM_DIAG_RESPONSE_TESTS_MAX]):
            spec = diag.get("tests", {}).get(name, {})
            test = response.tests[t]
            test.name = name
            test.pluginName = spec.get("plugin", name)
            test.categoryIndex = _TEST_CATEGORY.get(name, 3)
            outcomes = []
            for k, g in enumerate(gpus):
                outcome = OUTCOMES[spec.get("results", {}).get(str(g), spec.get("default", "pass"))]
                res = response.results[n_results]
                res.entity.entityGroupId = FE_GPU
                res.entity.entityId = g
                res.result = outcome
                res.testId = t
                test.resultIndices[k] = n_results
                n_results += 1
                outcomes.append(outcome)
            test.numResults = len(gpus)
            errors = list(spec.get("errors", []))
            failing = [g for g, o in zip(gpus, outcomes, strict=True) if o == OUTCOMES["fail"]]
            for g in failing:
                if not any(e.get("gpu") == g for e in errors):
                    errors.append({"gpu": g, "code": 1, "msg": f"{name} failed on GPU {g}."})
            for e in errors:
                if n_errors >= dcgm_structs.DCGM_DIAG_RESPONSE_ERRORS_MAX:
                    break
                err = response.errors[n_errors]
                err.entity.entityGroupId = FE_GPU if e.get("gpu") is not None else FE_NONE
                err.entity.entityId = e.get("gpu") or 0
                err.code = int(e.get("code", 1))
                err.category = int(e.get("category", 15))  # DCGM_FR_EC_HARDWARE_OTHER
                err.severity = int(e.get("severity", 2))  # DCGM_ERROR_ISOLATE
                err.msg = e["msg"]
                err.testId = t
                test.errorIndices[test.numErrors] = n_errors
                test.numErrors += 1
                n_errors += 1
            for note in spec.get("info", []):
                if n_info >= dcgm_structs.DCGM_DIAG_RESPONSE_INFO_MAX_V2:
                    break
                inf = response.info[n_info]
                inf.entity.entityGroupId = FE_GPU if note.get("gpu") is not None else FE_NONE
                inf.entity.entityId = note.get("gpu") or 0
                inf.msg = note["msg"]
                inf.testId = t
                test.infoIndices[test.numInfo] = n_info
                test.numInfo += 1
                n_info += 1
            test.result = max(outcomes, key=_RESULT_RANK.__getitem__) if outcomes else 4
        response.numTests = min(len(tests), dcgm_structs.DCGM_DIAG_RESPONSE_TESTS_MAX)
        response.numResults = n_results
        response.numErrors = n_errors
        response.numInfo = n_info
        return ST_OK

    # --- driver detach / attach (present when the state says the library has them) ----------
    @_api
    def dcgmDetachDriver(self, details, handle):
        self._conn(handle)
        status = int(read_state()["driver"].get("detach_status", 0))
        if status:
            raise _Status(status)
        update_state(lambda s: s["driver"].update(attached=False))
        return ST_OK

    @_api
    def dcgmAttachDriver(self, details, handle):
        self._conn(handle)
        status = int(read_state()["driver"].get("attach_status", 0))
        if status:
            raise _Status(status)
        update_state(lambda s: s["driver"].update(attached=True))
        return ST_OK


def _builtin_value(state, gpu, field_id):
    """Values the engine knows without being told (identity fields)."""
    return {
        1: state["driver"]["version"],
        4: len(_gpus(state)),
        50: gpu["model"],
        51: gpu.get("brand", "NVIDIA"),
        52: gpu["index"],
        53: gpu.get("serial", ""),
        54: gpu["uuid"],
        57: gpu["pci_bus_id"],
    }.get(field_id)


# --- policy delivery thread --------------------------------------------------------------------

_VALUE_MEMBER = {
    0x1: ("dbe", ("location", "numerrors")),
    0x2: ("pci", ("counter",)),
    0x4: ("mpr", ("sbepages", "dbepages")),
    0x8: ("thermal", ("thermalViolation",)),
    0x10: ("power", ("powerViolation",)),
    0x20: ("nvlink", ("fieldId", "counter")),
    0x40: ("xid", ("errnum",)),
}


def _ensure_policy_thread() -> None:
    global _thread
    with _proc_lock:
        if _thread is not None and _thread.is_alive():
            return
        _thread = threading.Thread(target=_policy_loop, name="dcgm-standin-policy", daemon=True)
        _thread.start()


def _policy_loop() -> None:
    while True:
        _wake.wait(0.02)
        _wake.clear()
        try:
            _deliver_pending()
        except Exception as e:  # keep the engine thread alive, but say why
            record("policy_thread_error", error=repr(e))


def _deliver_pending() -> None:
    try:
        state = read_state()
    except (OSError, ValueError):
        return
    violations = state.get("violations", [])
    with _proc_lock:
        regs = list(_registrations)
    for reg in regs:
        if not _conn_valid(reg.conn, state):
            continue
        for v in violations:
            if v["seq"] <= reg.seen_seq:
                continue
            reg.seen_seq = v["seq"]
            _deliver(reg, state, v)


def _deliver(reg: _Registration, state: dict, violation: dict) -> None:
    import dcgm_structs  # noqa: PLC0415

    cond = violation["condition"]
    gpu = violation["gpu"]
    if not cond & reg.condition:
        return
    try:
        gpus = Library._group_gpus(reg.conn, state, reg.group_id)
    except _Status:
        return
    policy = reg.conn.policies.get(gpu)
    if gpu not in gpus or policy is None or not policy["condition"] & cond:
        return
    callback = reg.callback_ref()
    if callback is None:
        # With the real library this is a call through a freed ctypes thunk (a crash).
        record("policy_callback_lost", condition=cond, gpu=gpu, seq=violation["seq"])
        return
    response = dcgm_structs.c_dcgmPolicyCallbackResponse_v2()
    response.version = 2 << 24 | ctypes.sizeof(response)
    response.condition = cond
    response.gpuId = gpu
    member, names = _VALUE_MEMBER[cond]
    value = getattr(response.val, member)
    value.timestamp = int(violation.get("timestamp", _now_us()))
    for name in names:
        raw = violation.get("values", {}).get(name, 0)
        if name == "location" and isinstance(raw, str):
            raw = dcgm_structs.c_dcgmPolicyConditionDbe_t.LOCATIONS[raw]
        setattr(value, name, int(raw))
    record(
        "policy_callback",
        condition=cond,
        gpu=gpu,
        seq=violation["seq"],
        callback=reg.callback_type,
    )
    user = id(reg.user_data.value) if isinstance(reg.user_data, ctypes.py_object) else 0
    callback(ctypes.pointer(response), user)


# --- control API for tests ---------------------------------------------------------------------


class Control:
    """Drives the fake host engine through its state file (works across processes)."""

    def __init__(self, path, *, state: dict | None = None):
        self.path = str(path)
        if state is not None or not os.path.exists(self.path):
            _write_state(self.path, state if state is not None else default_state())

    @property
    def env(self) -> dict[str, str]:
        """Environment for a process that should use this engine (plus PYTHONPATH)."""
        pythonpath = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
        return {STATE_ENV: self.path, "PYTHONPATH": pythonpath}

    def state(self) -> dict:
        with open(self.path, encoding="utf-8") as f:
            return json.load(f)

    def update(self, mutate) -> dict:
        return update_state(mutate, self.path)

    # library and host engine
    def set_library_installed(self, installed: bool) -> None:
        self.update(lambda s: s.update(library=installed))

    def host_engine_down(self) -> None:
        self.update(lambda s: s["engine"].update(up=False))

    def host_engine_up(self) -> None:
        """Start the host engine again: a new process, so old handles stay invalid."""

        def up(s):
            if not s["engine"]["up"]:
                s["engine"]["generation"] += 1
            s["engine"]["up"] = True
            s["driver"]["attached"] = True

        self.update(up)

    def restart_host_engine(self) -> None:
        def restart(s):
            s["engine"].update(up=True, generation=s["engine"]["generation"] + 1)
            s["driver"]["attached"] = True

        self.update(restart)

    def set_listen_address(self, address: str | None = None, unix_socket: str | None = None):
        """Only accept connections to this address / unix socket (None: accept any)."""
        self.update(lambda s: s["engine"].update(address=address, unix_socket=unix_socket))

    # GPUs
    def set_gpus(self, gpus: list[dict]) -> None:
        """Each GPU: index, pci_bus_id, uuid, model, serial, profiling (see default_gpu)."""
        self.update(lambda s: s.update(gpus=gpus))

    def set_profiling_supported(self, gpu: int, *, supported: bool) -> None:
        def change(s):
            next(g for g in s["gpus"] if g["index"] == gpu)["profiling"] = supported

        self.update(change)

    def set_profiling_module_loaded(self, loaded: bool) -> None:
        self.update(lambda s: s.update(profiling_module_loaded=loaded))

    def set_field_values(self, gpu: int, values: dict[int, float | int | str | None]) -> None:
        """Latest value of each field id on a GPU (None: blank)."""

        def change(s):
            per_gpu = s.setdefault("fields", {}).setdefault(str(gpu), {})
            per_gpu.update({str(k): v for k, v in values.items()})

        self.update(change)

    # health
    def add_health_incident(
        self, system: int, health: int, code: int, message: str, gpu: int
    ) -> None:
        """An incident dcgmHealthCheck reports while its system is watched (until cleared)."""
        incident = {
            "system": system,
            "health": health,
            "code": code,
            "message": message,
            "gpu": gpu,
        }
        self.update(lambda s: s.setdefault("incidents", []).append(incident))

    def clear_health_incidents(self) -> None:
        self.update(lambda s: s.update(incidents=[]))

    # policy
    def fire_policy_violation(self, condition: int, gpu: int, **values) -> int:
        """A violation of one DCGM_POLICY_COND_* bit on a GPU; values are the fields of its
        struct (dbe: location, numerrors; pci: counter; mpr: sbepages, dbepages; thermal:
        thermalViolation; power: powerViolation; nvlink: fieldId, counter; xid: errnum;
        any: timestamp). Delivered once to every matching registration. Returns its seq."""
        if condition not in _VALUE_MEMBER:
            raise ValueError(f"condition must be one DCGM_POLICY_COND_* bit, not {condition:#x}")
        seq_box = []

        def fire(s):
            seq = s.get("next_seq", 1)
            s["next_seq"] = seq + 1
            timestamp = values.pop("timestamp", _now_us())
            s.setdefault("violations", []).append(
                {
                    "seq": seq,
                    "condition": condition,
                    "gpu": gpu,
                    "timestamp": timestamp,
                    "values": values,
                }
            )
            seq_box.append(seq)

        self.update(fire)
        return seq_box[0]

    # diagnostics
    def set_diag_test(
        self,
        name: str,
        *,
        results: dict[int, str] | None = None,
        default: str = "pass",
        errors: list[dict] | None = None,
        info: list[dict] | None = None,
    ) -> None:
        """Outcome of one diag test: results per GPU (pass|skip|warn|fail|notrun, others
        `default`), errors [{gpu, code (DCGM_FR_*), msg, category?, severity?}], info
        [{gpu, msg}]. A failing GPU without an error gets a generic one."""
        spec = {
            "results": {str(k): v for k, v in (results or {}).items()},
            "default": default,
            "errors": errors or [],
            "info": info or [],
        }
        for outcome in [*spec["results"].values(), default]:
            if outcome not in OUTCOMES:
                raise ValueError(f"unknown outcome {outcome!r}")
        self.update(lambda s: s["diag"].setdefault("tests", {}).update({name: spec}))

    def set_diag_level_tests(self, level: int, names: list[str]) -> None:
        self.update(lambda s: s["diag"].setdefault("levels", {}).update({str(level): names}))

    def set_diag_error(self, status: int | None, message: str = "", **extra) -> None:
        """Make the diag unable to run: it returns `status` (a DCGM_ST_* code) with a system
        error carrying `message`. None clears it."""
        error = None if status is None else {"status": status, "message": message, **extra}
        self.update(lambda s: s["diag"].update(error=error))

    def set_diag_duration(self, seconds: float) -> None:
        self.update(lambda s: s["diag"].update(duration_s=seconds))

    # driver
    def set_driver_detach(
        self, *, available: bool = True, detach_status: int = 0, attach_status: int = 0
    ) -> None:
        """available=False: the library lacks dcgmDetachDriver/dcgmAttachDriver (before 4.5).
        Decided when a process first looks the function up."""
        self.update(
            lambda s: s["driver"].update(
                detach_available=available, detach_status=detach_status, attach_status=attach_status
            )
        )

    def driver_attached(self) -> bool:
        return bool(self.state()["driver"]["attached"])

    # call log
    def calls(self, fn: str | None = None) -> list[dict]:
        path = self.path + ".calls.jsonl"
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as f:
            entries = [json.loads(line) for line in f if line.strip()]
        return [e for e in entries if fn is None or e["fn"] == fn]

    def clear_calls(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path + ".calls.jsonl")

    def wait_for_call(self, fn: str, *, count: int = 1, timeout: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.calls(fn)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"{fn} called {len(found)} times, expected {count}")
            time.sleep(0.02)


# --- directory helpers -------------------------------------------------------------------------

_LOGGER_MODULES = ("DcgmGroup.py", "DcgmDiag.py")


def bindings_dir() -> Path:
    """The stand-in bindings directory (what sources.dcgm.bindings_path would point at)."""
    return HERE


def make_logger_defect_copy(dest) -> Path:
    """Copy the stand-in to dest with the unguarded `import logger` of DCGM 4.2-4.5's
    DcgmGroup.py and DcgmDiag.py: importing those (or pydcgm) then fails with
    ModuleNotFoundError: No module named 'logger' unless a `logger` module is importable."""
    dest = Path(dest)
    shutil.copytree(HERE, dest, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    for name in _LOGGER_MODULES:
        path = dest / name
        text = path.read_text(encoding="utf-8")
        start = text.index("# logger is a module of DCGM")
        end = text.index("# END logger import\n") + len("# END logger import\n")
        path.write_text(text[:start] + "import logger\n" + text[end:], encoding="utf-8")
    return dest
