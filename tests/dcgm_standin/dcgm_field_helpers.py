# Stand-in for DCGM's Python bindings: dcgm_field_helpers.py.
# API followed: DCGM 4.5 (DcgmFieldValue, DcgmFieldValueTimeSeries, DcgmFieldValueCollection,
# DcgmFieldValueEntityCollection and their enumeration callbacks). Not the real DCGM.
import ctypes
import json

import dcgm_agent
import dcgm_fields
import dcgm_fields_internal
import dcgm_structs
import dcgmvalue


class DcgmFieldValue:
    """Python-friendly copy of a c_dcgmFieldValue_v1: ts, fieldId, fieldType, value, isBlank."""

    def __init__(self, rawValue):
        if type(rawValue) is not dcgm_structs.c_dcgmFieldValue_v1:
            raise Exception("Unexpected rawValue type %s" % str(type(rawValue)))
        self.ts = rawValue.ts
        self.fieldId = rawValue.fieldId
        self.fieldType = chr(rawValue.fieldType)
        self.isBlank = False
        self.value = None
        if rawValue.status != dcgm_structs.DCGM_ST_OK:
            self.isBlank = True
            return
        if self.fieldType == dcgm_fields.DCGM_FT_DOUBLE:
            self.value = float(rawValue.value.dbl)
            self.isBlank = dcgmvalue.DCGM_FP64_IS_BLANK(self.value)
        elif self.fieldType in (dcgm_fields.DCGM_FT_INT64, dcgm_fields.DCGM_FT_TIMESTAMP):
            self.value = int(rawValue.value.i64)
            self.isBlank = dcgmvalue.DCGM_INT64_IS_BLANK(self.value)
        elif self.fieldType == dcgm_fields.DCGM_FT_STRING:
            self.value = str(rawValue.value.str)
            self.isBlank = dcgmvalue.DCGM_STR_IS_BLANK(self.value)
        elif self.fieldType == dcgm_fields.DCGM_FT_BINARY:
            if self.fieldId in (
                dcgm_fields_internal.DCGM_FI_DEV_COMPUTE_PIDS,
                dcgm_fields_internal.DCGM_FI_DEV_GRAPHICS_PIDS,
            ):
                stats = dcgm_structs.c_dcgmRunningProcess_t()
                ctypes.memmove(ctypes.addressof(stats), rawValue.value.blob, stats.FieldsSizeof())
                self.value = stats
                self.isBlank = dcgmvalue.DCGM_INT64_IS_BLANK(stats.pid)
            elif self.fieldId == dcgm_fields.DCGM_FI_SYNC_BOOST:
                self.value = None
            else:
                raise Exception("Blobs not handled yet for fieldId %d" % self.fieldId)
        else:
            raise Exception("Unhandled fieldType: %s" % self.fieldType)


class DcgmFieldValueTimeSeries:
    def __init__(self):
        self.values = []  # in timestamp order

    def __len__(self):
        return len(self.values)

    def __getitem__(self, key):
        return self.values[key]

    def InsertValue(self, value):
        if not self.values or value.ts >= self.values[-1].ts:
            self.values.append(value)
            return
        for i, existing in enumerate(self.values):
            if value.ts < existing.ts:
                self.values.insert(i, value)
                return


class FieldValueEncoder(json.JSONEncoder):
    def default(self, o):
        out = []
        for item in o:
            if not isinstance(item, DcgmFieldValue):
                return json.JSONEncoder.default(self, o)
            if not item.isBlank:
                out.append({"Timestamp": item.ts, "FieldId": item.fieldId, "Value": item.value})
        return out


def py_helper_dcgm_field_values_since_callback(gpuId, values, numValues, userData):
    ctypes.cast(userData, ctypes.py_object).value._ProcessValues(gpuId, values[0:numValues])
    return 0


helper_dcgm_field_values_since_callback = dcgm_agent.dcgmFieldValueEnumeration_f(
    py_helper_dcgm_field_values_since_callback
)


def py_helper_dcgm_field_values_since_callback_v2(
    entityGroupId, entityId, values, numValues, userData
):
    target = ctypes.cast(userData, ctypes.py_object).value
    target._ProcessValuesV2(entityGroupId, entityId, values[0:numValues])
    return 0


helper_dcgm_field_values_since_callback_v2 = dcgm_agent.dcgmFieldValueEntityEnumeration_f(
    py_helper_dcgm_field_values_since_callback_v2
)


def py_helper_dcgm_field_values_since_entity_callback(
    entityGroupId, entityId, values, numValues, userData
):
    target = ctypes.cast(userData, ctypes.py_object).value
    target._ProcessValues(entityGroupId, entityId, values[0:numValues])
    return 0


helper_dcgm_field_values_since_entity_callback = dcgm_agent.dcgmFieldValueEntityEnumeration_f(
    py_helper_dcgm_field_values_since_entity_callback
)


class DcgmFieldValueCollection:
    """.values[gpuId][fieldId] -> DcgmFieldValueTimeSeries"""

    def __init__(self, handle, groupId):
        self.values = {}
        self.entityValues = {}
        self._handle = handle
        self._groupId = groupId
        self._numValuesSeen = 0
        self._nextSinceTimestamp = 0

    def _ProcessValues(self, gpuId, values):
        self._numValuesSeen += len(values)
        per_gpu = self.values.setdefault(gpuId, {})
        for raw in values:
            value = DcgmFieldValue(raw)
            per_gpu.setdefault(value.fieldId, DcgmFieldValueTimeSeries()).InsertValue(value)

    def _ProcessValuesV2(self, entityGroupId, entityId, values):
        self._numValuesSeen += len(values)
        per_entity = self.entityValues.setdefault(entityGroupId, {}).setdefault(entityId, {})
        for raw in values:
            value = DcgmFieldValue(raw)
            per_entity.setdefault(value.fieldId, DcgmFieldValueTimeSeries()).InsertValue(value)

    def GetLatestValues(self, fieldGroup):
        ret = dcgm_agent.dcgmGetLatestValues(
            self._handle,
            self._groupId,
            fieldGroup.fieldGroupId,
            helper_dcgm_field_values_since_callback,
            self,
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def GetAllSinceLastCall(self, fieldGroup):
        before = self._numValuesSeen
        self._nextSinceTimestamp = dcgm_agent.dcgmGetValuesSince(
            self._handle,
            self._groupId,
            fieldGroup.fieldGroupId,
            self._nextSinceTimestamp,
            helper_dcgm_field_values_since_callback,
            self,
        )
        return self._numValuesSeen - before

    def GetLatestValues_v2(self, fieldGroup):
        ret = dcgm_agent.dcgmGetLatestValues_v2(
            self._handle,
            self._groupId,
            fieldGroup.fieldGroupId,
            helper_dcgm_field_values_since_callback_v2,
            self,
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def EmptyValues(self):
        self.values = {}
        self._numValuesSeen = 0


class DcgmFieldValueEntityCollection:
    """.values[entityGroupId][entityId][fieldId] -> DcgmFieldValueTimeSeries"""

    def __init__(self, handle, groupId):
        self.values = {}
        self._handle = handle
        self._groupId = groupId
        self._numValuesSeen = 0
        self._nextSinceTimestamp = 0

    def _ProcessValues(self, entityGroupId, entityId, values):
        self._numValuesSeen += len(values)
        per_entity = self.values.setdefault(entityGroupId, {}).setdefault(entityId, {})
        for raw in values:
            value = DcgmFieldValue(raw)
            per_entity.setdefault(value.fieldId, DcgmFieldValueTimeSeries()).InsertValue(value)

    def GetLatestValues(self, fieldGroup):
        ret = dcgm_agent.dcgmGetLatestValues_v2(
            self._handle,
            self._groupId,
            fieldGroup.fieldGroupId,
            helper_dcgm_field_values_since_entity_callback,
            self,
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def GetAllSinceLastCall(self, fieldGroup):
        before = self._numValuesSeen
        self._nextSinceTimestamp = dcgm_agent.dcgmGetValuesSince_v2(
            self._handle,
            self._groupId,
            fieldGroup.fieldGroupId,
            self._nextSinceTimestamp,
            helper_dcgm_field_values_since_entity_callback,
            self,
        )
        return self._numValuesSeen - before

    def EmptyValues(self):
        self.values = {}
        self._numValuesSeen = 0
