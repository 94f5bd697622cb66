"""The DCGM stand-in (tests/dcgm_standin): real struct layouts and error classes, state shared
across processes, host-engine restart, missing library, the logger import defect, and policy
callbacks delivered on the engine's own thread."""

from __future__ import annotations

import ctypes
import importlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parent / "dcgm_standin"
BINDING_MODULES = [
    "dcgm_structs",
    "dcgm_agent",
    "dcgm_fields",
    "dcgm_fields_internal",
    "dcgm_errors",
    "dcgmvalue",
    "dcgm_field_helpers",
    "pydcgm",
    "DcgmHandle",
    "DcgmGroup",
    "DcgmStatus",
    "DcgmSystem",
    "DcgmFieldGroup",
    "DcgmDiag",
    "DcgmLogging",
    "_standin_engine",
]


@pytest.fixture
def dcgm(tmp_path, monkeypatch):
    """The stand-in imported in this process, on a fresh state file; yields (modules, control)."""
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in BINDING_MODULES:
        sys.modules.pop(name, None)
    engine = importlib.import_module("_standin_engine")
    control = engine.Control(tmp_path / "state.json")
    monkeypatch.setenv(engine.STATE_ENV, control.path)
    mods = {name: importlib.import_module(name) for name in BINDING_MODULES}
    yield mods, control
    while _open:
        _open.pop().Shutdown()
    engine.reset_process()
    for name in BINDING_MODULES:
        sys.modules.pop(name, None)


_open: list = []


def _connect(mods, **kwargs):
    handle = mods["pydcgm"].DcgmHandle(**(kwargs or {"ipAddress": "127.0.0.1:5555"}))
    _open.append(handle)
    return handle


def test_struct_layouts_and_versions_match_the_real_bindings(dcgm):
    mods, _ = dcgm
    s = mods["dcgm_structs"]
    # version word = sizeof | version << 24, sizes as on x86-64 with the real layouts
    assert s.dcgmHealthResponse_version5 == ctypes.sizeof(s.c_dcgmHealthResponse_v5) | 5 << 24
    assert ctypes.sizeof(s.c_dcgmConnectV2Params_v2) == 16
    assert ctypes.sizeof(s.c_dcgmIncidentInfo_t) == 1044
    assert [f[0] for f in s.c_dcgmPolicyCallbackResponse_v2._fields_] == [
        "version",
        "condition",
        "val",
        "gpuId",
    ]
    assert [f[0] for f in s.c_dcgmPolicyCallbackResponse_v2.Value._fields_] == [
        "dbe",
        "pci",
        "mpr",
        "thermal",
        "power",
        "nvlink",
        "xid",
    ]
    assert s.c_dcgmRunDiag_t is s.c_dcgmRunDiag_v10
    assert mods["dcgm_agent"].g_latestDiagResponseVer == s.dcgmDiagResponse_version12
    assert (s.DCGM_POLICY_COND_DBE, s.DCGM_POLICY_COND_XID) == (0x1, 0x40)
    assert mods["dcgm_fields"].DCGM_FI_PROF_SM_ACTIVE == 1002
    assert mods["dcgm_fields"].DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL == 449
    assert mods["dcgm_errors"].DCGM_FR_XID_ERROR == 101
    assert mods["dcgmvalue"].DCGM_FP64_BLANK == 2.0**47


def test_error_classes_are_per_code_subclasses(dcgm):
    s = dcgm[0]["dcgm_structs"]
    err = s.DCGMError(s.DCGM_ST_CONNECTION_NOT_VALID)
    assert type(err) is s.DCGMError_ConnectionNotValid
    assert isinstance(err, s.dcgmExceptionClass(s.DCGM_ST_CONNECTION_NOT_VALID))
    assert s.dcgmExceptionClass(s.DCGM_ST_LIBRARY_NOT_FOUND) is s.DCGMError_LibraryNotFound
    assert s.DCGMError_ProfilingNotSupported().value == s.DCGM_ST_PROFILING_NOT_SUPPORTED
    assert "not valid any longer" in str(err)


def test_calls_before_library_load_are_uninitialized(dcgm):
    mods, _ = dcgm
    with pytest.raises(mods["dcgm_structs"].DCGMError_Uninitialized):
        mods["dcgm_agent"].dcgmInit()


def test_missing_library_raises_library_not_found(dcgm):
    mods, control = dcgm
    control.set_library_installed(False)
    s = mods["dcgm_structs"]
    with pytest.raises(s.DCGMError_LibraryNotFound):
        s._dcgmInit()
    with pytest.raises(s.DCGMError_LibraryNotFound):
        _connect(mods)


def test_devices_attributes_and_version(dcgm):
    mods, control = dcgm
    engine = mods["_standin_engine"]
    control.set_gpus([engine.default_gpu(0), engine.default_gpu(3, model="NVIDIA A100-SXM4-80GB")])
    handle = _connect(mods)
    agent = mods["dcgm_agent"]
    assert agent.dcgmGetAllSupportedDevices(handle.handle) == [0, 3]
    attrs = agent.dcgmGetDeviceAttributes(handle.handle, 3)
    assert isinstance(attrs, mods["dcgm_structs"].c_dcgmDeviceAttributes_v3)
    assert attrs.identifiers.deviceName == "NVIDIA A100-SXM4-80GB"
    assert attrs.identifiers.pciBusId == "00000000:48:00.0"
    assert attrs.identifiers.uuid.startswith("GPU-")
    with pytest.raises(mods["dcgm_structs"].DCGMError_Badparam):
        agent.dcgmGetDeviceAttributes(handle.handle, 7)
    info = agent.dcgmVersionInfo()
    assert info.rawBuildInfoString.startswith("version:4.5.0;")


def test_connect_fails_when_host_engine_is_down(dcgm):
    mods, control = dcgm
    control.host_engine_down()
    with pytest.raises(mods["dcgm_structs"].DCGMError_ConnectionNotValid):
        _connect(mods)
    control.set_listen_address(unix_socket="/run/dcgm.sock")
    control.host_engine_up()
    with pytest.raises(mods["dcgm_structs"].DCGMError_ConnectionNotValid):
        mods["pydcgm"].DcgmHandle(unixSocketPath="/run/other.sock")
    handle = _connect(mods, unixSocketPath="/run/dcgm.sock")
    assert control.calls("dcgmConnect_v2")[-1]["unix_socket"] is True
    assert mods["dcgm_agent"].dcgmGetAllSupportedDevices(handle.handle) == [0, 1]


def test_restart_invalidates_handles_until_reconnect(dcgm):
    mods, control = dcgm
    agent, s = mods["dcgm_agent"], mods["dcgm_structs"]
    handle = _connect(mods)
    group = agent.dcgmGroupCreate(handle.handle, s.DCGM_GROUP_EMPTY, "g")
    control.restart_host_engine()
    with pytest.raises(s.dcgmExceptionClass(s.DCGM_ST_CONNECTION_NOT_VALID)):
        agent.dcgmGroupAddDevice(handle.handle, group, 0)
    with pytest.raises(s.DCGMError_ConnectionNotValid):
        agent.dcgmHealthCheck(handle.handle, group)
    handle.Shutdown()
    again = _connect(mods)
    assert agent.dcgmGetAllSupportedDevices(again.handle) == [0, 1]
    with pytest.raises(s.DCGMError_NotConfigured):  # groups died with the old engine
        agent.dcgmGroupAddDevice(again.handle, group, 0)


def test_health_check_reports_watched_incidents_in_the_real_layout(dcgm):
    mods, control = dcgm
    agent, s, errors = mods["dcgm_agent"], mods["dcgm_structs"], mods["dcgm_errors"]
    handle = _connect(mods)
    group = agent.dcgmGroupCreate(handle.handle, s.DCGM_GROUP_EMPTY, "health")
    agent.dcgmGroupAddDevice(handle.handle, group, 1)
    control.add_health_incident(
        s.DCGM_HEALTH_WATCH_MEM,
        s.DCGM_HEALTH_RESULT_FAIL,
        errors.DCGM_FR_VOLATILE_DBE_DETECTED,
        "Detected 2 volatile double-bit ECC error(s)",
        1,
    )
    control.add_health_incident(
        s.DCGM_HEALTH_WATCH_PCIE,
        s.DCGM_HEALTH_RESULT_WARN,
        errors.DCGM_FR_PCI_REPLAY_RATE,
        "replays",
        0,
    )
    agent.dcgmHealthSet(handle.handle, group, s.DCGM_HEALTH_WATCH_MEM | s.DCGM_HEALTH_WATCH_PCIE)
    assert agent.dcgmHealthGet(handle.handle, group) == 0x11
    resp = agent.dcgmHealthCheck(handle.handle, group)
    assert isinstance(resp, s.c_dcgmHealthResponse_v5)
    assert resp.version == s.dcgmHealthResponse_version5
    assert (resp.overallHealth, resp.incidentCount) == (
        s.DCGM_HEALTH_RESULT_FAIL,
        1,
    )  # GPU 0 not in group
    inc = resp.incidents[0]
    assert (inc.system, inc.health, inc.error.code) == (
        s.DCGM_HEALTH_WATCH_MEM,
        s.DCGM_HEALTH_RESULT_FAIL,
        errors.DCGM_FR_VOLATILE_DBE_DETECTED,
    )
    assert inc.error.msg.startswith("Detected 2")
    assert (inc.entityInfo.entityGroupId, inc.entityInfo.entityId) == (1, 1)
    agent.dcgmHealthSet(handle.handle, group, s.DCGM_HEALTH_WATCH_PCIE)
    assert agent.dcgmHealthCheck(handle.handle, group).incidentCount == 0


def _policy(s, condition):
    policy = s.c_dcgmPolicy_v1()
    policy.version = s.dcgmPolicy_version1
    policy.condition = condition
    return policy


def test_policy_callbacks_fire_once_on_the_engine_thread(dcgm):
    mods, control = dcgm
    agent, s = mods["dcgm_agent"], mods["dcgm_structs"]
    handle = _connect(mods)
    group = agent.dcgmGroupCreate(handle.handle, s.DCGM_GROUP_DEFAULT, "all")
    conditions = s.DCGM_POLICY_COND_DBE | s.DCGM_POLICY_COND_XID | s.DCGM_POLICY_COND_NVLINK
    agent.dcgmPolicySet(handle.handle, group, _policy(s, conditions), None)
    assert agent.dcgmPolicyGet(handle.handle, group, 2, None)[1].condition == conditions
    got = []
    done = threading.Event()

    @ctypes.CFUNCTYPE(None, ctypes.POINTER(s.c_dcgmPolicyCallbackResponse_v2), ctypes.c_uint64)
    def callback(response, user_data):
        copy = s.c_dcgmPolicyCallbackResponse_v2()
        ctypes.memmove(ctypes.addressof(copy), response, copy.FieldsSizeof())
        got.append(
            (copy, threading.current_thread(), ctypes.cast(user_data, ctypes.py_object).value)
        )
        if len(got) == 2:
            done.set()

    agent.dcgmPolicyRegister_v2(handle.handle, group, conditions, callback, "mine")
    control.fire_policy_violation(s.DCGM_POLICY_COND_XID, 1, errnum=79)
    control.fire_policy_violation(s.DCGM_POLICY_COND_DBE, 0, location="DEVICE", numerrors=3)
    control.fire_policy_violation(s.DCGM_POLICY_COND_THERMAL, 0, thermalViolation=95)  # not set
    assert done.wait(5)
    time.sleep(0.2)
    assert len(got) == 2
    xid, thread, user = got[0]
    assert (xid.condition, xid.gpuId, xid.val.xid.errnum) == (s.DCGM_POLICY_COND_XID, 1, 79)
    assert thread is not threading.current_thread()
    assert user == b"mine"  # str arguments reach the library as bytes (ensure_byte_strings)
    dbe = got[1][0]
    assert (dbe.val.dbe.location, dbe.val.dbe.numerrors) == (2, 3)
    assert [c["gpu"] for c in control.calls("policy_callback")] == [1, 0]


def test_policy_callback_must_be_kept_alive_and_be_a_ctypes_function(dcgm):
    mods, control = dcgm
    agent, s = mods["dcgm_agent"], mods["dcgm_structs"]
    handle = _connect(mods)
    group = agent.dcgmGroupCreate(handle.handle, s.DCGM_GROUP_DEFAULT, "all")
    agent.dcgmPolicySet(handle.handle, group, _policy(s, s.DCGM_POLICY_COND_PCI), None)
    with pytest.raises(ctypes.ArgumentError):
        agent.dcgmPolicyRegister_v2(handle.handle, group, s.DCGM_POLICY_COND_PCI, print, None)
    prototype = ctypes.CFUNCTYPE(
        None, ctypes.POINTER(s.c_dcgmPolicyCallbackResponse_v2), ctypes.c_uint64
    )
    agent.dcgmPolicyRegister_v2(
        handle.handle, group, s.DCGM_POLICY_COND_PCI, prototype(lambda r, u: None), None
    )
    control.fire_policy_violation(s.DCGM_POLICY_COND_PCI, 0, counter=12)
    lost = control.wait_for_call("policy_callback_lost")
    assert lost[0]["condition"] == s.DCGM_POLICY_COND_PCI


def test_profiling_fields_values_and_unsupported_gpu(dcgm):
    mods, control = dcgm
    agent, s, f = mods["dcgm_agent"], mods["dcgm_structs"], mods["dcgm_fields"]
    handle = _connect(mods)
    control.set_field_values(
        0, {f.DCGM_FI_PROF_SM_ACTIVE: 0.75, f.DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL: 5}
    )
    group = mods["pydcgm"].DcgmGroup(handle, groupName="prof")
    group.AddGpu(0)
    fg = mods["pydcgm"].DcgmFieldGroup(
        handle,
        "prof",
        [
            f.DCGM_FI_PROF_SM_ACTIVE,
            f.DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,
            f.DCGM_FI_PROF_DRAM_ACTIVE,
        ],
    )
    group.samples.WatchFields(fg, 1_000_000, 60.0, 0)
    before = group.samples.GetLatest_v2(fg).values[f.DCGM_FE_GPU][0]
    assert before[f.DCGM_FI_PROF_SM_ACTIVE][0].isBlank  # not sampled yet
    agent.dcgmUpdateAllFields(handle.handle, 1)
    values = group.samples.GetLatest_v2(fg).values[f.DCGM_FE_GPU][0]
    assert values[f.DCGM_FI_PROF_SM_ACTIVE][0].value == 0.75
    assert values[f.DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL][0].value == 5
    assert values[f.DCGM_FI_PROF_DRAM_ACTIVE][0].isBlank
    assert values[f.DCGM_FI_PROF_DRAM_ACTIVE][0].value == mods["dcgmvalue"].DCGM_FP64_BLANK
    pair = s.c_dcgmGroupEntityPair_t(f.DCGM_FE_GPU, 1)
    raw = agent.dcgmEntitiesGetLatestValues(handle.handle, [pair], [f.DCGM_FI_PROF_SM_ACTIVE], 0)
    assert raw[0].status == s.DCGM_ST_NOT_WATCHED
    control.set_profiling_supported(1, supported=False)
    other = mods["pydcgm"].DcgmGroup(handle, groupName="gpu1")
    other.AddGpu(1)
    with pytest.raises(s.DCGMError_ProfilingNotSupported):
        other.samples.WatchFields(fg, 1_000_000, 60.0, 0)
    assert f.DcgmFieldGetById(f.DCGM_FI_PROF_SM_ACTIVE).tag == "sm_active"
    fg.Delete()


def _diag_response(mods, handle, level, gpus):
    diag = mods["DcgmDiag"].DcgmDiag(gpuIds=gpus, testNamesStr=str(level))
    return diag.Execute(handle.handle)


def test_diag_results_per_test_and_gpu(dcgm):
    mods, control = dcgm
    s, errors = mods["dcgm_structs"], mods["dcgm_errors"]
    handle = _connect(mods)
    control.set_diag_test(
        "memory",
        results={1: "fail"},
        errors=[{"gpu": 1, "code": errors.DCGM_FR_FAULTY_MEMORY, "msg": "bad DRAM"}],
        info=[{"gpu": 0, "msg": "allocated 95%"}],
    )
    control.set_diag_test("pcie", default="warn")
    resp = _diag_response(mods, handle, 2, [0, 1])
    assert isinstance(resp, s.c_dcgmDiagResponse_v12)
    names = [resp.tests[i].name for i in range(resp.numTests)]
    assert names == ["software", "pcie", "memory"]
    memory = resp.tests[2]
    assert memory.result == s.DCGM_DIAG_RESULT_FAIL
    per_gpu = {
        resp.results[i].entity.entityId: resp.results[i].result
        for i in memory.resultIndices[: memory.numResults]
    }
    assert per_gpu == {0: s.DCGM_DIAG_RESULT_PASS, 1: s.DCGM_DIAG_RESULT_FAIL}
    err = resp.errors[memory.errorIndices[0]]
    assert (err.code, err.msg, err.entity.entityId, err.testId) == (
        errors.DCGM_FR_FAULTY_MEMORY,
        "bad DRAM",
        1,
        2,
    )
    assert resp.info[memory.infoIndices[0]].msg == "allocated 95%"
    assert resp.tests[1].result == s.DCGM_DIAG_RESULT_WARN
    assert mods["DcgmDiag"].GetGpuCount(resp) == 2
    assert resp.dcgmVersion == "4.5.0"
    call = control.calls("dcgmActionValidate_v2")[-1]
    assert (call["level"], call["gpus"]) == (2, [0, 1])


def test_diag_that_cannot_run_raises_with_the_system_error(dcgm):
    mods, control = dcgm
    s = mods["dcgm_structs"]
    handle = _connect(mods)
    control.set_diag_error(s.DCGM_ST_DIAG_ALREADY_RUNNING, "Another diagnostic is running")
    with pytest.raises(s.DCGMError_DiagAlreadyRunning) as info:
        _diag_response(mods, handle, 1, [0])
    assert "Another diagnostic is running" in str(info.value)
    control.set_diag_error(None)
    group = mods["dcgm_agent"].dcgmGroupCreate(handle.handle, s.DCGM_GROUP_DEFAULT, "all")
    resp = mods["dcgm_agent"].dcgmRunDiagnostic(handle.handle, group, s.DCGM_DIAG_LVL_SHORT)
    assert resp.numTests == 1


def test_detach_attach_and_their_absence(dcgm):
    mods, control = dcgm
    agent, s = mods["dcgm_agent"], mods["dcgm_structs"]
    handle = _connect(mods)
    agent.dcgmDetachDriver(handle.handle)
    assert not control.driver_attached()
    assert agent.dcgmGetAllSupportedDevices(handle.handle) == []
    agent.dcgmAttachDriver(handle.handle)
    assert agent.dcgmGetAllSupportedDevices(handle.handle) == [0, 1]
    fns = [c["fn"] for c in control.calls() if c["fn"].endswith("Driver")]
    assert fns == ["dcgmDetachDriver", "dcgmAttachDriver"]
    while _open:
        _open.pop().Shutdown()
    mods["_standin_engine"].reset_process()
    control.set_driver_detach(available=False)
    handle = _connect(mods)
    with pytest.raises(s.DCGMError_FunctionNotFound):
        agent.dcgmDetachDriver(handle.handle)


def test_state_and_calls_cross_processes(tmp_path):
    engine = _load_engine()
    control = engine.Control(tmp_path / "state.json")
    control.fire_policy_violation(0x40, 0, errnum=48)  # before registration: not delivered
    script = textwrap.dedent(
        """
        import ctypes, sys, time
        import pydcgm, dcgm_agent, dcgm_structs as s
        h = pydcgm.DcgmHandle(ipAddress="127.0.0.1")
        g = dcgm_agent.dcgmGroupCreate(h.handle, s.DCGM_GROUP_DEFAULT, "all")
        p = s.c_dcgmPolicy_v1(); p.version = s.dcgmPolicy_version1; p.condition = 0x40
        dcgm_agent.dcgmPolicySet(h.handle, g, p, None)
        seen = []
        cb = ctypes.CFUNCTYPE(None, ctypes.POINTER(s.c_dcgmPolicyCallbackResponse_v2),
                              ctypes.c_uint64)(lambda r, u: seen.append(r.contents.val.xid.errnum))
        dcgm_agent.dcgmPolicyRegister_v2(h.handle, g, 0x40, cb, None)
        print("gpus", dcgm_agent.dcgmGetAllSupportedDevices(h.handle), flush=True)
        deadline = time.time() + 10
        while not seen and time.time() < deadline:
            time.sleep(0.02)
        print("xid", seen, flush=True)
        dcgm_agent.dcgmGetAllSupportedDevices(h.handle)
        print("still connected", flush=True)
        sys.stdin.readline()  # the host engine restarts meanwhile
        try:
            dcgm_agent.dcgmGetAllSupportedDevices(h.handle)
        except s.DCGMError_ConnectionNotValid:
            print("restarted", flush=True)
        """
    )
    control.set_gpus([engine.default_gpu(0), engine.default_gpu(1), engine.default_gpu(2)])
    env = {**os.environ, **control.env}
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "gpus [0, 1, 2]"
        control.fire_policy_violation(0x40, 2, errnum=79)
        assert proc.stdout.readline().strip() == "xid [79]"
        assert proc.stdout.readline().strip() == "still connected"
        control.restart_host_engine()
    finally:
        out, _ = proc.communicate("go\n", timeout=30)
    assert out.strip() == "restarted"  # a connection from before the restart is gone
    assert proc.returncode == 0
    register = control.calls("dcgmPolicyRegister_v2")
    assert register[0]["pid"] == proc.pid
    assert register[0]["callback"] == "CFunctionType"
    assert control.calls("policy_callback")[0]["thread"] == "dcgm-standin-policy"


def _load_engine():
    sys.modules.pop("_standin_engine", None)
    sys.path.insert(0, str(STANDIN))
    try:
        return importlib.import_module("_standin_engine")
    finally:
        sys.path.remove(str(STANDIN))
        sys.modules.pop("_standin_engine", None)


def test_logger_defect_copy(tmp_path):
    engine = _load_engine()
    control = engine.Control(tmp_path / "state.json")
    copy = engine.make_logger_defect_copy(tmp_path / "bindings")
    env = {**os.environ, **control.env, "PYTHONPATH": str(copy)}
    run = [sys.executable, "-c", "import pydcgm"]
    failed = subprocess.run(run, env=env, capture_output=True, text=True, check=False)
    assert failed.returncode == 1
    assert "ModuleNotFoundError: No module named 'logger'" in failed.stderr
    diag = subprocess.run(
        [sys.executable, "-c", "import DcgmDiag"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "No module named 'logger'" in diag.stderr
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "logger.py").write_text("def debug(*a): pass\nnvvs_trace_log_filename = None\n")
    env["PYTHONPATH"] = os.pathsep.join([str(copy), str(shim)])
    ok = subprocess.run(
        [sys.executable, "-c", "import pydcgm, DcgmDiag; print('ok')"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.stdout.strip() == "ok", ok.stderr
    clean_env = {**os.environ, **control.env}
    clean = subprocess.run(run, env=clean_env, capture_output=True, text=True, check=False)
    assert clean.returncode == 0, clean.stderr
