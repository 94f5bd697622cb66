# Stand-in for DCGM's Python bindings: DcgmFieldGroup.py.
# API followed: DCGM 4.5. Not the real DCGM.
import threading

import dcgm_agent
import dcgm_structs


class DcgmFieldGroup:
    """A named group of field ids in the host engine."""

    groups = {}  # fieldGroupId value -> DcgmFieldGroup created by this process
    groupLock = threading.RLock()

    def __init__(self, dcgmHandle, name="", fieldIds=None, fieldGroupId=None):
        fieldIds = fieldIds or []
        self.name = name
        self.fieldIds = fieldIds
        self._dcgmHandle = dcgmHandle
        self.wasCreated = False
        if fieldGroupId is not None:
            self.fieldGroupId = fieldGroupId
            info = dcgm_agent.dcgmFieldGroupGetInfo(self._dcgmHandle.handle, self.fieldGroupId)
            self.name = info.fieldGroupName
            self.fieldIds = info.fieldIds
            return
        self.fieldGroupId = None  # so that __del__ works if the create fails
        self.fieldGroupId = dcgm_agent.dcgmFieldGroupCreate(self._dcgmHandle.handle, fieldIds, name)
        self.wasCreated = True
        with DcgmFieldGroup.groupLock:
            DcgmFieldGroup.groups.setdefault(self.fieldGroupId.value, self)

    def Delete(self):
        with DcgmFieldGroup.groupLock:
            destroy = DcgmFieldGroup.groups.pop(self.fieldGroupId.value, None) is not None
        if destroy:
            dcgm_agent.dcgmFieldGroupDestroy(self._dcgmHandle.handle, self.fieldGroupId)
        self.fieldGroupId = None
        self._dcgmHandle = None

    @classmethod
    def clear(cls):
        with cls.groupLock:
            cls.groups.clear()

    @classmethod
    def reset(cls):
        with cls.groupLock:
            for key in list(cls.groups):
                cls.groups[key].Delete()
        cls.clear()

    def __del__(self):
        if self._dcgmHandle is None or self.fieldGroupId is None:
            return
        try:
            self.Delete()
        except (AttributeError, TypeError):
            pass
        except dcgm_structs.DCGMError as e:
            expected = (
                dcgm_structs.DCGM_ST_NO_DATA,
                dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID,
                dcgm_structs.DCGM_ST_BADPARAM,
            )
            if e.value not in expected:
                raise
