# Stand-in for DCGM's Python bindings: dcgm_agent.py (Python mirror of dcgm_agent.h).
# API followed: DCGM 4.5: same function names, argument order, defaults and return values as
# the real module for the functions below; each calls the "library" through
# dcgm_structs._dcgmGetFunctionPointer exactly like the real one, and the library here is the
# fake host engine of _standin_engine. Not the real DCGM.
import functools
from ctypes import (
    CFUNCTYPE,
    POINTER,
    byref,
    c_double,
    c_int,
    c_int32,
    c_int64,
    c_uint,
    c_uint16,
    c_uint32,
    c_void_p,
    py_object,
)

import dcgm_fields
import dcgm_structs

g_latestDiagResponseVer = dcgm_structs.dcgmDiagResponse_version12
g_latestRunDiagVer = dcgm_structs.dcgmRunDiag_version10


def ensure_byte_strings():
    """Decorator: str arguments reach the library as UTF-8 bytes."""

    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            args = tuple(a.encode("utf-8") if isinstance(a, str) else a for a in args)
            kwargs = {k: v.encode("utf-8") if isinstance(v, str) else v for k, v in kwargs.items()}
            return fn(*args, **kwargs)

        return wrapper

    return decorator


dcgmFP = dcgm_structs._dcgmGetFunctionPointer


def _check(ret):
    dcgm_structs._dcgmCheckReturn(ret)
    return ret


## Init and connection
@ensure_byte_strings()
def dcgmInit():
    handle = c_void_p()
    return _check(dcgmFP("dcgmInit")(byref(handle)))


@ensure_byte_strings()
def dcgmShutdown():
    return _check(dcgmFP("dcgmShutdown")())


@ensure_byte_strings()
def dcgmStartEmbedded(opMode):
    handle = c_void_p()
    _check(dcgmFP("dcgmStartEmbedded")(opMode, byref(handle)))
    return handle


@ensure_byte_strings()
def dcgmStopEmbedded(dcgm_handle):
    return _check(dcgmFP("dcgmStopEmbedded")(dcgm_handle))


@ensure_byte_strings()
def dcgmConnect(ip_address):
    handle = c_void_p()
    _check(dcgmFP("dcgmConnect")(ip_address, byref(handle)))
    return handle


@ensure_byte_strings()
def dcgmConnect_v2(ip_address, connectParams, version=dcgm_structs.c_dcgmConnectV2Params_version):
    connectParams.version = version
    handle = c_void_p()
    _check(dcgmFP("dcgmConnect_v2")(ip_address, byref(connectParams), byref(handle)))
    return handle


@ensure_byte_strings()
def dcgmDisconnect(dcgm_handle):
    return _check(dcgmFP("dcgmDisconnect")(dcgm_handle))


@ensure_byte_strings()
def dcgmVersionInfo():
    msg = dcgm_structs.c_dcgmVersionInfo_v2()
    msg.version = dcgm_structs.dcgmVersionInfo_version2
    _check(dcgmFP("dcgmVersionInfo")(byref(msg)))
    return msg


@ensure_byte_strings()
def dcgmHostengineIsHealthy(dcgmHandle):
    health = dcgm_structs.c_dcgmHostengineHealth_v1()
    health.version = dcgm_structs.dcgmHostengineHealth_version1
    _check(dcgmFP("dcgmHostengineIsHealthy")(dcgmHandle, byref(health)))
    return health


## Devices
def _gpu_id_list(fn_name, dcgm_handle):
    count = c_uint()
    ids = (c_uint * dcgm_structs.DCGM_MAX_NUM_DEVICES)()
    _check(dcgmFP(fn_name)(dcgm_handle, ids, byref(count)))
    return list(ids[0 : int(count.value)])


@ensure_byte_strings()
def dcgmGetAllSupportedDevices(dcgm_handle):
    return _gpu_id_list("dcgmGetAllSupportedDevices", dcgm_handle)


@ensure_byte_strings()
def dcgmGetAllDevices(dcgm_handle):
    return _gpu_id_list("dcgmGetAllDevices", dcgm_handle)


@ensure_byte_strings()
def dcgmGetDeviceAttributes(dcgm_handle, gpuId, version=dcgm_structs.dcgmDeviceAttributes_version3):
    fn = dcgmFP("dcgmGetDeviceAttributes")
    if version != dcgm_structs.dcgmDeviceAttributes_version3:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_VER_MISMATCH)
    attrs = dcgm_structs.c_dcgmDeviceAttributes_v3()
    attrs.version = dcgm_structs.dcgmDeviceAttributes_version3
    _check(fn(dcgm_handle, c_int(gpuId), byref(attrs)))
    return attrs


## Groups
@ensure_byte_strings()
def dcgmGroupCreate(dcgm_handle, type, groupName):  # noqa: A002 - the real parameter name
    group_id = c_void_p()
    _check(dcgmFP("dcgmGroupCreate")(dcgm_handle, type, groupName, byref(group_id)))
    return group_id


@ensure_byte_strings()
def dcgmGroupDestroy(dcgm_handle, group_id):
    return _check(dcgmFP("dcgmGroupDestroy")(dcgm_handle, group_id))


@ensure_byte_strings()
def dcgmGroupAddDevice(dcgm_handle, group_id, gpu_id):
    return _check(dcgmFP("dcgmGroupAddDevice")(dcgm_handle, group_id, gpu_id))


@ensure_byte_strings()
def dcgmGroupAddEntity(dcgm_handle, group_id, entityGroupId, entityId):
    return _check(dcgmFP("dcgmGroupAddEntity")(dcgm_handle, group_id, entityGroupId, entityId))


@ensure_byte_strings()
def dcgmGroupRemoveDevice(dcgm_handle, group_id, gpu_id):
    return _check(dcgmFP("dcgmGroupRemoveDevice")(dcgm_handle, group_id, gpu_id))


@ensure_byte_strings()
def dcgmGroupGetInfo(dcgm_handle, group_id, version=dcgm_structs.c_dcgmGroupInfo_version3):
    fn = dcgmFP("dcgmGroupGetInfo")
    if version != dcgm_structs.c_dcgmGroupInfo_version3:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_VER_MISMATCH)
    info = dcgm_structs.c_dcgmGroupInfo_v3()
    info.version = dcgm_structs.c_dcgmGroupInfo_version3
    _check(fn(dcgm_handle, group_id, byref(info)))
    return info


@ensure_byte_strings()
def dcgmGroupGetAllIds(dcgmHandle):
    count = c_uint()
    ids = (c_void_p * dcgm_structs.DCGM_MAX_NUM_GROUPS)()
    _check(dcgmFP("dcgmGroupGetAllIds")(dcgmHandle, ids, byref(count)))
    return list(ids[0 : int(count.value)])


## Field groups
@ensure_byte_strings()
def dcgmFieldGroupCreate(dcgm_handle, fieldIds, fieldGroupName):
    field_group_id = c_void_p()
    num = c_int32(len(fieldIds))
    ids = (c_uint16 * len(fieldIds))(*fieldIds)
    fn = dcgmFP("dcgmFieldGroupCreate")
    _check(fn(dcgm_handle, num, byref(ids), fieldGroupName, byref(field_group_id)))
    return field_group_id


@ensure_byte_strings()
def dcgmFieldGroupDestroy(dcgm_handle, fieldGroupId):
    return _check(dcgmFP("dcgmFieldGroupDestroy")(dcgm_handle, fieldGroupId))


@ensure_byte_strings()
def dcgmFieldGroupGetInfo(dcgm_handle, fieldGroupId):
    info = dcgm_structs.c_dcgmFieldGroupInfo_v1()
    info.version = dcgm_structs.dcgmFieldGroupInfo_version1
    info.fieldGroupId = fieldGroupId
    _check(dcgmFP("dcgmFieldGroupGetInfo")(dcgm_handle, byref(info)))
    return info


@ensure_byte_strings()
def dcgmFieldGroupGetAll(dcgm_handle):
    info = dcgm_structs.c_dcgmAllFieldGroup_v1()
    info.version = dcgm_structs.dcgmAllFieldGroup_version1
    _check(dcgmFP("dcgmFieldGroupGetAll")(dcgm_handle, byref(info)))
    return info


## Status handles
@ensure_byte_strings()
def dcgmStatusCreate():
    status_handle = c_void_p()
    _check(dcgmFP("dcgmStatusCreate")(byref(status_handle)))
    return status_handle


@ensure_byte_strings()
def dcgmStatusDestroy(status_handle):
    return _check(dcgmFP("dcgmStatusDestroy")(status_handle))


@ensure_byte_strings()
def dcgmStatusGetCount(status_handle):
    count = c_uint()
    _check(dcgmFP("dcgmStatusGetCount")(status_handle, byref(count)))
    return count.value


@ensure_byte_strings()
def dcgmStatusPopError(status_handle):
    info = dcgm_structs.c_dcgmErrorInfo_v1()
    ret = dcgmFP("dcgmStatusPopError")(status_handle, byref(info))
    return info if ret == dcgm_structs.DCGM_ST_OK else None


@ensure_byte_strings()
def dcgmStatusClear(status_handle):
    return _check(dcgmFP("dcgmStatusClear")(status_handle))


## Field values
@ensure_byte_strings()
def dcgmUpdateAllFields(dcgm_handle, waitForUpdate):
    return _check(dcgmFP("dcgmUpdateAllFields")(dcgm_handle, c_int(waitForUpdate)))


# Callback types; the first argument of CFUNCTYPE is the return type.
dcgmFieldValueEnumeration_f = CFUNCTYPE(
    c_int32, c_uint32, POINTER(dcgm_structs.c_dcgmFieldValue_v1), c_int32, c_void_p
)
dcgmFieldValueEntityEnumeration_f = CFUNCTYPE(
    c_int32, c_uint32, c_uint32, POINTER(dcgm_structs.c_dcgmFieldValue_v1), c_int32, c_void_p
)


@ensure_byte_strings()
def dcgmGetValuesSince(dcgm_handle, groupId, fieldGroupId, sinceTimestamp, enumCB, userData):
    next_since = c_int64()
    fn = dcgmFP("dcgmGetValuesSince")
    ret = fn(
        dcgm_handle,
        groupId,
        fieldGroupId,
        c_int64(sinceTimestamp),
        byref(next_since),
        enumCB,
        py_object(userData),
    )
    _check(ret)
    return next_since.value


@ensure_byte_strings()
def dcgmGetValuesSince_v2(dcgm_handle, groupId, fieldGroupId, sinceTimestamp, enumCB, userData):
    next_since = c_int64()
    fn = dcgmFP("dcgmGetValuesSince_v2")
    ret = fn(
        dcgm_handle,
        groupId,
        fieldGroupId,
        c_int64(sinceTimestamp),
        byref(next_since),
        enumCB,
        py_object(userData),
    )
    _check(ret)
    return next_since.value


@ensure_byte_strings()
def dcgmGetLatestValues(dcgm_handle, groupId, fieldGroupId, enumCB, userData):
    fn = dcgmFP("dcgmGetLatestValues")
    return _check(fn(dcgm_handle, groupId, fieldGroupId, enumCB, py_object(userData)))


@ensure_byte_strings()
def dcgmGetLatestValues_v2(dcgm_handle, groupId, fieldGroupId, enumCB, userData):
    fn = dcgmFP("dcgmGetLatestValues_v2")
    return _check(fn(dcgm_handle, groupId, fieldGroupId, enumCB, py_object(userData)))


@ensure_byte_strings()
def dcgmWatchFields(dcgm_handle, groupId, fieldGroupId, updateFreq, maxKeepAge, maxKeepSamples):
    fn = dcgmFP("dcgmWatchFields")
    ret = fn(
        dcgm_handle,
        groupId,
        fieldGroupId,
        c_int64(updateFreq),
        c_double(maxKeepAge),
        c_int32(maxKeepSamples),
    )
    return _check(ret)


@ensure_byte_strings()
def dcgmUnwatchFields(dcgm_handle, groupId, fieldGroupId):
    return _check(dcgmFP("dcgmUnwatchFields")(dcgm_handle, groupId, fieldGroupId))


@ensure_byte_strings()
def dcgmEntityGetLatestValues(dcgmHandle, entityGroup, entityId, fieldIds):
    values = (dcgm_structs.c_dcgmFieldValue_v1 * len(fieldIds))()
    ids = (c_uint16 * len(fieldIds))(*fieldIds)
    fn = dcgmFP("dcgmEntityGetLatestValues")
    ret = fn(
        dcgmHandle,
        c_uint(entityGroup),
        dcgm_fields.c_dcgm_field_eid_t(entityId),
        ids,
        c_uint(len(fieldIds)),
        values,
    )
    _check(ret)
    return values


@ensure_byte_strings()
def dcgmEntitiesGetLatestValues(dcgmHandle, entities, fieldIds, flags):
    values = (dcgm_structs.c_dcgmFieldValue_v2 * (len(fieldIds) * len(entities)))()
    pairs = (dcgm_structs.c_dcgmGroupEntityPair_t * len(entities))(*entities)
    ids = (c_uint16 * len(fieldIds))(*fieldIds)
    fn = dcgmFP("dcgmEntitiesGetLatestValues")
    ret = fn(dcgmHandle, pairs, c_uint(len(entities)), ids, c_uint(len(fieldIds)), flags, values)
    _check(ret)
    return values


## Health
@ensure_byte_strings()
def dcgmHealthSet(dcgm_handle, groupId, systems):
    return _check(dcgmFP("dcgmHealthSet")(dcgm_handle, groupId, systems))


@ensure_byte_strings()
def dcgmHealthSet_v2(dcgm_handle, groupId, systems, updateInterval, maxKeepAge):
    params = dcgm_structs.c_dcgmHealthSetParams_v2()
    params.version = dcgm_structs.dcgmHealthSetParams_version2
    params.groupId = groupId
    params.systems = systems
    params.updateInterval = updateInterval
    params.maxKeepAge = maxKeepAge
    return _check(dcgmFP("dcgmHealthSet_v2")(dcgm_handle, byref(params)))


@ensure_byte_strings()
def dcgmHealthGet(dcgm_handle, groupId):
    systems = c_int32()
    _check(dcgmFP("dcgmHealthGet")(dcgm_handle, groupId, byref(systems)))
    return systems.value


@ensure_byte_strings()
def dcgmHealthCheck(dcgm_handle, groupId, version=dcgm_structs.dcgmHealthResponse_version5):
    if version != dcgm_structs.dcgmHealthResponse_version5:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_VER_MISMATCH)
    results = dcgm_structs.c_dcgmHealthResponse_v5()
    results.version = dcgm_structs.dcgmHealthResponse_version5
    _check(dcgmFP("dcgmHealthCheck")(dcgm_handle, groupId, byref(results)))
    return results


## Policy
@ensure_byte_strings()
def dcgmPolicyGet(dcgm_handle, group_id, count, status_handle):
    policies = (dcgm_structs.c_dcgmPolicy_v1 * count)()
    for policy in policies:
        policy.version = dcgm_structs.dcgmPolicy_version1
    _check(dcgmFP("dcgmPolicyGet")(dcgm_handle, group_id, count, policies, status_handle))
    return policies[0:count]


@ensure_byte_strings()
def dcgmPolicySet(dcgm_handle, group_id, policy, status_handle):
    return _check(dcgmFP("dcgmPolicySet")(dcgm_handle, group_id, byref(policy), status_handle))


@ensure_byte_strings()
def dcgmPolicyRegister_v2(dcgm_handle, groupId, condition, callback, userData):
    """callback: a ctypes CFUNCTYPE(None, POINTER(c_dcgmPolicyCallbackResponse_v2), c_uint64)
    object. DCGM calls it from its own thread; the caller must keep it referenced."""
    fn = dcgmFP("dcgmPolicyRegister_v2")
    return _check(fn(dcgm_handle, groupId, condition, callback, py_object(userData)))


@ensure_byte_strings()
def dcgmPolicyUnregister(dcgm_handle, groupId, condition):
    return _check(dcgmFP("dcgmPolicyUnregister")(dcgm_handle, groupId, condition))


@ensure_byte_strings()
def dcgmPolicyTrigger(dcgm_handle):
    return _check(dcgmFP("dcgmPolicyTrigger")(dcgm_handle))


## Diagnostics
def helperDiagCheckReturn_v2(ret, response):
    """For response v11 and later: on error, attach the system errors' messages to the exception."""
    assert response.version >= dcgm_structs.dcgmDiagResponse_version11, (
        "Expected version %d or later, got %d"
        % (dcgm_structs.dcgmDiagResponse_version11, response.version)
    )
    try:
        dcgm_structs._dcgmCheckReturn(ret)
    except dcgm_structs.DCGMError as e:
        count = min(response.numErrors, dcgm_structs.DCGM_DIAG_RESPONSE_ERRORS_MAX)
        messages = [
            err.msg
            for err in response.errors[:count]
            if err.testId == dcgm_structs.DCGM_DIAG_RESPONSE_SYSTEM_ERROR
        ]
        if messages:
            e.SetAdditionalInfo(", ".join(messages))
        raise
    return response


def helperDiagCheckReturn(ret, response):
    return helperDiagCheckReturn_v2(ret, response)


@ensure_byte_strings()
def dcgmActionValidate_v2(
    dcgm_handle, runDiagInfo, runDiagVersion=dcgm_structs.dcgmRunDiag_version10
):
    """Run the diagnostic described by runDiagInfo (c_dcgmRunDiag_v10: groupId or entityIds,
    validate = level 1-4 or testNames). Returns a c_dcgmDiagResponse_v12."""
    if runDiagVersion == dcgm_structs.dcgmRunDiag_version7:
        # The v7 request answers with the v10 response layout, which the stand-in does not carry.
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_VER_MISMATCH)
    response = dcgm_structs.c_dcgmDiagResponse_v12()
    response.version = dcgm_structs.dcgmDiagResponse_version12
    runDiagInfo.version = runDiagVersion
    ret = dcgmFP("dcgmActionValidate_v2")(dcgm_handle, byref(runDiagInfo), byref(response))
    return helperDiagCheckReturn(ret, response)


@ensure_byte_strings()
def dcgmActionValidate(dcgm_handle, group_id, validate):
    response = dcgm_structs.c_dcgmDiagResponse_v12()
    response.version = dcgm_structs.dcgmDiagResponse_version12
    runDiagInfo = dcgm_structs.c_dcgmRunDiag_v10()
    runDiagInfo.version = dcgm_structs.dcgmRunDiag_version10
    runDiagInfo.validate = validate
    runDiagInfo.groupId = group_id
    ret = dcgmFP("dcgmActionValidate_v2")(dcgm_handle, byref(runDiagInfo), byref(response))
    return helperDiagCheckReturn(ret, response)


@ensure_byte_strings()
def dcgmRunDiagnostic(dcgm_handle, group_id, diagLevel):
    """diagLevel: a DCGM_DIAG_LVL_* constant. Returns a c_dcgmDiagResponse_v12."""
    response = dcgm_structs.c_dcgmDiagResponse_v12()
    response.version = dcgm_structs.dcgmDiagResponse_version12
    ret = dcgmFP("dcgmRunDiagnostic")(dcgm_handle, group_id, diagLevel, byref(response))
    return helperDiagCheckReturn(ret, response)


## Driver detach/attach (DCGM 4.5 and later)
@ensure_byte_strings()
def dcgmDetachDriver(dcgm_handle):
    return _check(dcgmFP("dcgmDetachDriver")(dcgm_handle))


@ensure_byte_strings()
def dcgmAttachDriver(dcgm_handle):
    return _check(dcgmFP("dcgmAttachDriver")(dcgm_handle))
