# Stand-in for DCGM's Python bindings: DcgmGroup.py.
# API followed: DCGM 4.5, with the guarded `logger` import of the fixed bindings (DCGM 4.2-4.5
# as shipped import it unguarded; _standin_engine.make_logger_defect_copy() builds that form).
# Namespaces carried: samples, health, policy, action. Not the real DCGM.
import os
import threading

import dcgm_agent
import dcgm_field_helpers
import dcgm_structs
import pydcgm

# logger is a module of DCGM's own test framework, only present when that framework runs.
if (
    "__DCGM_TESTING_FRAMEWORK_ACTIVE" in os.environ
    and os.environ["__DCGM_TESTING_FRAMEWORK_ACTIVE"] == "1"
):
    import logger
else:
    logger = None
# END logger import


class DcgmGroupSamples:
    def __init__(self, dcgmHandle, groupId, dcgmGroup):
        self._dcgmHandle = dcgmHandle
        self._groupId = groupId
        self._dcgmGroup = dcgmGroup

    def WatchFields(self, fieldGroup, updateFreq, maxKeepAge, maxKeepSamples):
        """Start sampling fieldGroup every updateFreq usec, keeping maxKeepAge seconds."""
        ret = dcgm_agent.dcgmWatchFields(
            self._dcgmHandle.handle,
            self._groupId,
            fieldGroup.fieldGroupId,
            updateFreq,
            maxKeepAge,
            maxKeepSamples,
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def UnwatchFields(self, fieldGroup):
        ret = dcgm_agent.dcgmUnwatchFields(
            self._dcgmHandle.handle, self._groupId, fieldGroup.fieldGroupId
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def GetLatest(self, fieldGroup):
        """DcgmFieldValueCollection: .values[gpuId][fieldId][0].value"""
        dfvc = dcgm_field_helpers.DcgmFieldValueCollection(self._dcgmHandle.handle, self._groupId)
        dfvc.GetLatestValues(fieldGroup)
        return dfvc

    def GetLatest_v2(self, fieldGroup):
        """DcgmFieldValueEntityCollection: .values[entityGroupId][entityId][fieldId][0].value"""
        dfvec = dcgm_field_helpers.DcgmFieldValueEntityCollection(
            self._dcgmHandle.handle, self._groupId
        )
        dfvec.GetLatestValues(fieldGroup)
        return dfvec

    def GetAllSinceLastCall(self, dfvc, fieldGroup):
        if dfvc is None:
            dfvc = dcgm_field_helpers.DcgmFieldValueCollection(
                self._dcgmHandle.handle, self._groupId
            )
            dfvc.GetLatestValues(fieldGroup)
        else:
            dfvc.GetAllSinceLastCall(fieldGroup)
            if len(dfvc.values) == 0:
                dfvc.GetLatestValues(fieldGroup)
        return dfvc

    def GetAllSinceLastCall_v2(self, dfvec, fieldGroup):
        if dfvec is None:
            dfvec = dcgm_field_helpers.DcgmFieldValueEntityCollection(
                self._dcgmHandle.handle, self._groupId
            )
            dfvec.GetLatestValues(fieldGroup)
        else:
            dfvec.GetAllSinceLastCall(fieldGroup)
            if len(dfvec.values) == 0:
                dfvec.GetLatestValues(fieldGroup)
        return dfvec

    def UpdateAllFields(self, waitForUpdate):
        self._dcgmHandle.UpdateAllFields(waitForUpdate)


class DcgmGroupHealth:
    def __init__(self, dcgmHandle, groupId, dcgmGroup):
        self._dcgmHandle = dcgmHandle
        self._groupId = groupId
        self._dcgmGroup = dcgmGroup

    def Set(self, systems, updateInterval=None, maxKeepAge=None):
        """Enable the DCGM_HEALTH_WATCH_* systems (a bitmask) for this group."""
        if updateInterval is None or maxKeepAge is None:
            ret = dcgm_agent.dcgmHealthSet(self._dcgmHandle.handle, self._groupId, systems)
        else:
            ret = dcgm_agent.dcgmHealthSet_v2(
                self._dcgmHandle.handle, self._groupId, systems, updateInterval, maxKeepAge
            )
        dcgm_structs._dcgmCheckReturn(ret)

    def Get(self):
        return dcgm_agent.dcgmHealthGet(self._dcgmHandle.handle, self._groupId)

    def Check(self, version=dcgm_structs.dcgmHealthResponse_version5):
        """A dcgm_structs.c_dcgmHealthResponse_v5 with the incidents of the watched systems."""
        return dcgm_agent.dcgmHealthCheck(self._dcgmHandle.handle, self._groupId, version)


class DcgmGroupPolicy:
    def __init__(self, dcgmHandle, groupId, dcgmGroup):
        self._dcgmHandle = dcgmHandle
        self._groupId = groupId
        self._dcgmGroup = dcgmGroup
        self._policy = None
        self._condition = 0

    def Get(self, statusHandle=None):
        if statusHandle:
            statusHandle = statusHandle.handle
        count = len(self._dcgmGroup.GetGpuIds())
        if count <= 0:
            raise pydcgm.DcgmException("This group has no GPUs, cannot retrieve policies")
        return dcgm_agent.dcgmPolicyGet(self._dcgmHandle.handle, self._groupId, count, statusHandle)

    def Set(self, policy, statusHandle=None):
        if statusHandle:
            statusHandle = statusHandle.handle
        dcgm_agent.dcgmPolicySet(self._dcgmHandle.handle, self._groupId, policy, statusHandle)
        self._policy = policy

    def Register(self, condition, callback=None, userData=None):
        """callback is called from a DCGM thread on each violation of condition."""
        if callback is None:
            raise pydcgm.DcgmException("Callback must be provided to register that is not None")
        dcgm_agent.dcgmPolicyRegister_v2(
            self._dcgmHandle.handle, self._groupId, condition, callback, userData
        )
        self._condition |= condition

    def Unregister(self, condition):
        dcgm_agent.dcgmPolicyUnregister(self._dcgmHandle.handle, self._groupId, condition)

    def Trigger(self):
        dcgm_agent.dcgmPolicyTrigger(self._dcgmHandle.handle)

    def __del__(self):
        not_valid = dcgm_structs.dcgmExceptionClass(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)
        if self._condition != 0:
            if logger:
                logger.debug(f"DcgmGroup unregistering {self._condition} for {self._groupId}")
            try:
                dcgm_agent.dcgmPolicyUnregister(
                    self._dcgmHandle.handle, self._groupId, self._condition
                )
            except not_valid:
                pass
            self._condition = 0
        if self._policy is not None:
            cleared = dcgm_structs.c_dcgmPolicy_v1()
            cleared.version = dcgm_structs.dcgmPolicy_version1
            cleared.condition = 0
            try:
                self.Set(cleared)
            except not_valid:
                pass
            self._policy = None


class DcgmGroupAction:
    def __init__(self, dcgmHandle, groupId, dcgmGroup):
        self._dcgmHandle = dcgmHandle
        self._groupId = groupId
        self._dcgmGroup = dcgmGroup

    def Validate(self, validate):
        """Run the diagnostic at level validate (DCGM_POLICY_VALID_SV_*); c_dcgmDiagResponse_v12."""
        info = dcgm_structs.c_dcgmRunDiag_v10()
        info.version = dcgm_structs.dcgmRunDiag_version10
        info.validate = validate
        info.groupId = self._groupId
        return dcgm_agent.dcgmActionValidate_v2(self._dcgmHandle.handle, info)

    def RunDiagnostic(self, diagLevel):
        return dcgm_agent.dcgmRunDiagnostic(self._dcgmHandle.handle, self._groupId, diagLevel)

    def RunSpecificTest(self, testName):
        info = dcgm_structs.c_dcgmRunDiag_v10()
        info.version = dcgm_structs.dcgmRunDiag_version10
        for i, ch in enumerate(testName):
            info.testNames[0][i] = ch.encode("utf-8") if isinstance(ch, str) else ch
        info.groupId = self._groupId
        info.validate = dcgm_structs.DCGM_POLICY_VALID_NONE
        return dcgm_agent.dcgmActionValidate_v2(self._dcgmHandle.handle, info)


class DcgmGroup:
    groups = {}  # per-handle: group name -> DcgmGroup
    groupLock = threading.RLock()

    def __init__(
        self, dcgmHandle, groupId=None, groupName=None, groupType=dcgm_structs.DCGM_GROUP_EMPTY
    ):
        """groupId: bind to an existing group (DCGM_GROUP_ALL_GPUS: all GPUs); groupName:
        create a group of groupType with that name."""
        self._dcgmHandle = dcgmHandle
        if groupId is None and groupName is None:
            raise pydcgm.DcgmException("Either groupId or groupName is required")
        if groupId is not None:
            self._groupId = groupId
        else:
            self._groupId = dcgm_agent.dcgmGroupCreate(
                self._dcgmHandle.handle, groupType, groupName
            )
        self.name = groupName
        self.samples = DcgmGroupSamples(self._dcgmHandle, self._groupId, self)
        self.health = DcgmGroupHealth(self._dcgmHandle, self._groupId, self)
        self.policy = DcgmGroupPolicy(self._dcgmHandle, self._groupId, self)
        self.action = DcgmGroupAction(self._dcgmHandle, self._groupId, self)

    def Delete(self):
        self.samples = None
        self.health = None
        self.policy = None
        self.action = None
        if self._groupId is not None and not self._IsGroupIdStatic():
            ret = dcgm_agent.dcgmGroupDestroy(self._dcgmHandle.handle, self._groupId)
            dcgm_structs._dcgmCheckReturn(ret)
        self._groupId = None

    def _IsGroupIdStatic(self):
        gid = self._groupId.value if hasattr(self._groupId, "value") else self._groupId
        return gid in (dcgm_structs.DCGM_GROUP_ALL_GPUS, dcgm_structs.DCGM_GROUP_ALL_NVSWITCHES)

    def AddGpu(self, gpuId):
        if self._IsGroupIdStatic():
            raise pydcgm.DcgmException("Can't add a GPU to a static group")
        ret = dcgm_agent.dcgmGroupAddDevice(self._dcgmHandle.handle, self._groupId, gpuId)
        dcgm_structs._dcgmCheckReturn(ret)

    def AddEntity(self, entityGroupId, entityId):
        if self._IsGroupIdStatic():
            raise pydcgm.DcgmException("Can't add an entity to a static group")
        ret = dcgm_agent.dcgmGroupAddEntity(
            self._dcgmHandle.handle, self._groupId, entityGroupId, entityId
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def RemoveGpu(self, gpuId):
        if self._IsGroupIdStatic():
            raise pydcgm.DcgmException("Can't remove a GPU from a static group")
        ret = dcgm_agent.dcgmGroupRemoveDevice(self._dcgmHandle.handle, self._groupId, gpuId)
        dcgm_structs._dcgmCheckReturn(ret)

    def GetGpuIds(self):
        """GPU ids of this group."""
        import dcgm_fields  # noqa: PLC0415

        info = dcgm_agent.dcgmGroupGetInfo(self._dcgmHandle.handle, self._groupId)
        return [
            info.entityList[i].entityId
            for i in range(info.count)
            if info.entityList[i].entityGroupId == dcgm_fields.DCGM_FE_GPU
        ]

    def GetEntities(self):
        info = dcgm_agent.dcgmGroupGetInfo(self._dcgmHandle.handle, self._groupId)
        return info.entityList[0 : info.count]

    def GetId(self):
        return self._groupId
