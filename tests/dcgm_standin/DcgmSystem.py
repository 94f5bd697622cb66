# Stand-in for DCGM's Python bindings: DcgmSystem.py.
# API followed: DCGM 4.5. Namespaces carried: discovery, fields. Not the real DCGM.
import ctypes

import dcgm_agent
import dcgm_fields
import dcgm_structs
import pydcgm


class DcgmSystemDiscovery:
    def __init__(self, dcgmHandle):
        self._dcgmHandle = dcgmHandle

    def GetAllGpuIds(self):
        return dcgm_agent.dcgmGetAllDevices(self._dcgmHandle.handle)

    def GetAllSupportedGpuIds(self):
        return dcgm_agent.dcgmGetAllSupportedDevices(self._dcgmHandle.handle)

    def GetGpuAttributes(self, gpuId):
        """A dcgm_structs.c_dcgmDeviceAttributes_v3 for gpuId."""
        return dcgm_agent.dcgmGetDeviceAttributes(self._dcgmHandle.handle, gpuId)


class DcgmSystemFields:
    def GetFieldById(self, fieldId):
        return dcgm_fields.DcgmFieldGetById(fieldId)

    def GetFieldByTag(self, tag):
        return dcgm_fields.DcgmFieldGetByTag(tag)


class DcgmSystem:
    def __init__(self, dcgmHandle):
        self._dcgmHandle = dcgmHandle
        self.discovery = DcgmSystemDiscovery(self._dcgmHandle)
        self.fields = DcgmSystemFields()

    def UpdateAllFields(self, waitForUpdate):
        ret = dcgm_agent.dcgmUpdateAllFields(self._dcgmHandle.handle, waitForUpdate)
        dcgm_structs._dcgmCheckReturn(ret)

    def GetDefaultGroup(self):
        return pydcgm.DcgmGroup(self._dcgmHandle, groupId=dcgm_structs.DCGM_GROUP_ALL_GPUS)

    def GetEmptyGroup(self, groupName):
        return pydcgm.DcgmGroup(self._dcgmHandle, groupName=groupName)

    def GetGroupWithGpuIds(self, groupName, gpuIds):
        group = pydcgm.DcgmGroup(self._dcgmHandle, groupName=groupName)
        for gpuId in gpuIds:
            group.AddGpu(gpuId)
        return group

    def GetGroupWithEntities(self, groupName, entities):
        group = pydcgm.DcgmGroup(self._dcgmHandle, groupName=groupName)
        for entity in entities:
            group.AddEntity(entity.entityGroupId, entity.entityId)
        return group

    def GetAllGroupIds(self):
        return dcgm_agent.dcgmGroupGetAllIds(self._dcgmHandle.handle)

    def GetAllFieldGroups(self):
        return dcgm_agent.dcgmFieldGroupGetAll(self._dcgmHandle.handle)

    def GetFieldGroupIdByName(self, name):
        groups = self.GetAllFieldGroups()
        for i in range(groups.numFieldGroups):
            if groups.fieldGroups[i].fieldGroupName == name:
                return ctypes.c_void_p(groups.fieldGroups[i].fieldGroupId)
        return None
