# Stand-in for DCGM's Python bindings: DcgmDiag.py.
# API followed: DCGM 4.5, with the guarded `logger` import of the fixed bindings (DCGM 4.2-4.5
# as shipped import it unguarded; _standin_engine.make_logger_defect_copy() builds that form).
# Not the real DCGM.
import os

import dcgm_agent
import dcgm_fields
import dcgm_structs

# logger is a module of DCGM's own test framework, only present when that framework runs.
if (
    "__DCGM_TESTING_FRAMEWORK_ACTIVE" in os.environ
    and os.environ["__DCGM_TESTING_FRAMEWORK_ACTIVE"] == "1"
):
    import logger
else:
    logger = None
# END logger import

g_latestDiagResponseVer = dcgm_structs.dcgmDiagResponse_version12
g_latestRunDiagVer = dcgm_structs.dcgmRunDiag_version10


class DcgmDiag:
    _versionMap = {
        dcgm_structs.dcgmRunDiag_version: 10,
        dcgm_structs.dcgmRunDiag_version7: 7,
        dcgm_structs.dcgmRunDiag_version8: 8,
        dcgm_structs.dcgmRunDiag_version9: 9,
        dcgm_structs.dcgmRunDiag_version10: 10,
    }

    def __init__(
        self,
        gpuIds=None,
        cpuIds=None,
        testNamesStr="",
        paramsStr="",
        ignoreErrorCodesStr="",
        verbose=True,
        version=dcgm_structs.dcgmRunDiag_version10,
        timeout=0,
    ):
        """testNamesStr: '' or '1'-'4' for a level, else comma-separated test names."""
        if version not in DcgmDiag._versionMap:
            raise ValueError("'%s' is not a valid version for dcgmRunDiag." % version)
        self.version = version
        struct = {
            dcgm_structs.dcgmRunDiag_version10: dcgm_structs.c_dcgmRunDiag_v10,
            dcgm_structs.dcgmRunDiag_version9: dcgm_structs.c_dcgmRunDiag_v9,
            dcgm_structs.dcgmRunDiag_version8: dcgm_structs.c_dcgmRunDiag_v8,
            dcgm_structs.dcgmRunDiag_version7: dcgm_structs.c_dcgmRunDiag_v7,
        }.get(version, dcgm_structs.c_dcgmRunDiag_t)
        self.runDiagInfo = struct()
        self.runDiagInfo.flags = 0
        self.numTests = 0
        self.numParams = 0
        self.gpuList = ""
        self.cpuList = ""
        self.expectedNumGpus = ""
        self.ignoreErrorCodes = ignoreErrorCodesStr
        self.SetVerbose(verbose)
        if testNamesStr == "":
            self.runDiagInfo.validate = 1
        elif testNamesStr in ("1", "2", "3", "4"):
            self.runDiagInfo.validate = int(testNamesStr)
        else:
            if testNamesStr.isdigit():
                raise ValueError("'%s' is not a valid test name." % testNamesStr)
            names = testNamesStr.split(",")
            if len(names) > dcgm_structs.DCGM_MAX_TEST_NAMES:
                raise ValueError(
                    "DcgmDiag cannot initialize: %d test names were specified exceeding the "
                    "limit of %d." % (len(names), dcgm_structs.DCGM_MAX_TEST_NAMES)
                )
            for name in names:
                self.AddTest(name)
        if paramsStr != "":
            params = paramsStr.split(";")
            if len(params) >= dcgm_structs.DCGM_MAX_TEST_PARMS:
                raise ValueError(
                    "DcgmDiag cannot initialize: %d parameters were specified, exceeding the "
                    "limit of %d." % (len(params), dcgm_structs.DCGM_MAX_TEST_PARMS)
                )
            for param in params:
                self.AddParameter(param)
        self.runDiagInfo.timeoutSeconds = timeout
        self.runDiagInfo.groupId = dcgm_structs.DCGM_GROUP_NULL
        if cpuIds:
            self.cpuList = ",".join("cpu:" + str(c) for c in cpuIds)
        if gpuIds:
            self.gpuList = ",".join(str(g) for g in gpuIds)
        if hasattr(self.runDiagInfo, "ignoreErrorCodes"):
            self.runDiagInfo.ignoreErrorCodes = self.ignoreErrorCodes
        if hasattr(self.runDiagInfo, "entityIds"):
            parts = [p for p in (self.gpuList, self.cpuList) if p]
            self.runDiagInfo.entityIds = ",".join(parts) if parts else "*,cpu:*"
        elif hasattr(self.runDiagInfo, "gpuList"):
            if self.gpuList:
                self.runDiagInfo.gpuList = self.gpuList
            else:
                self.runDiagInfo.groupId = dcgm_structs.DCGM_GROUP_ALL_GPUS
        if hasattr(self.runDiagInfo, "expectedNumEntities"):
            self.runDiagInfo.expectedNumEntities = self.expectedNumGpus
        if logger and logger.nvvs_trace_log_filename is not None:
            self.SetDebugLogFile(logger.nvvs_trace_log_filename)
            self.SetDebugLevel(5)

    def SetVerbose(self, val):
        if val:
            self.runDiagInfo.flags |= dcgm_structs.DCGM_RUN_FLAGS_VERBOSE
        else:
            self.runDiagInfo.flags &= ~dcgm_structs.DCGM_RUN_FLAGS_VERBOSE

    def UseFakeGpus(self):
        self.runDiagInfo.fakeGpuList = self.gpuList

    def GetStruct(self):
        return self.runDiagInfo

    def AddParameter(self, parameterStr):
        limit = dcgm_structs.DCGM_MAX_TEST_PARMS_LEN
        if self.version in (dcgm_structs.dcgmRunDiag_version8, dcgm_structs.dcgmRunDiag_version9):
            limit = dcgm_structs.DCGM_MAX_TEST_PARMS_LEN_V2
        if len(parameterStr) >= limit:
            raise ValueError(
                "DcgmDiag cannot add parameter '%s' because it exceeds max length %d."
                % (parameterStr, limit)
            )
        for i, ch in enumerate(parameterStr):
            self.runDiagInfo.testParms[self.numParams][i] = ch.encode("utf-8")
        self.numParams += 1

    def AddTest(self, testNameStr):
        if len(testNameStr) >= dcgm_structs.DCGM_MAX_TEST_NAMES_LEN:
            raise ValueError(
                "DcgmDiag cannot add test name '%s' because it exceeds max length %d."
                % (testNameStr, dcgm_structs.DCGM_MAX_TEST_NAMES_LEN)
            )
        for i, ch in enumerate(testNameStr):
            self.runDiagInfo.testNames[self.numTests][i] = ch.encode("utf-8")
        self.numTests += 1

    def SetStatsOnFail(self, val):
        if val:
            self.runDiagInfo.flags |= dcgm_structs.DCGM_RUN_FLAGS_STATSONFAIL

    def SetClocksEventMask(self, value):
        if isinstance(value, str) and len(value) >= dcgm_structs.DCGM_CLOCKS_EVENT_MASK_LEN:
            raise ValueError(
                "Clocks event mask value '%s' exceeds max length %d."
                % (value, dcgm_structs.DCGM_CLOCKS_EVENT_MASK_LEN - 1)
            )
        self.runDiagInfo.clocksEventMask = str(value)

    def SetThrottleMask(self, value):
        self.SetClocksEventMask(value)

    def SetFailEarly(self, enable=True, checkInterval=5):
        if not isinstance(checkInterval, int):
            raise ValueError("Invalid checkInterval value: %s" % checkInterval)
        if enable:
            self.runDiagInfo.flags |= dcgm_structs.DCGM_RUN_FLAGS_FAIL_EARLY
            self.runDiagInfo.failCheckInterval = checkInterval
        else:
            self.runDiagInfo.flags &= ~dcgm_structs.DCGM_RUN_FLAGS_FAIL_EARLY

    def Execute(self, handle):
        return dcgm_agent.dcgmActionValidate_v2(handle, self.runDiagInfo, self.version)

    def SetStatsPath(self, statsPath):
        if len(statsPath) >= dcgm_structs.DCGM_PATH_LEN:
            raise ValueError(
                "DcgmDiag cannot set statsPath '%s' because it exceeds max length %d."
                % (statsPath, dcgm_structs.DCGM_PATH_LEN)
            )
        self.runDiagInfo.statsPath = statsPath

    def SetConfigFileContents(self, configFileContents):
        if len(configFileContents) >= dcgm_structs.DCGM_MAX_CONFIG_FILE_LEN:
            raise ValueError(
                "Dcgm Diag cannot set config file contents to '%s' because it exceeds max "
                "length %d." % (configFileContents, dcgm_structs.DCGM_MAX_CONFIG_FILE_LEN)
            )
        self.runDiagInfo.configFileContents = configFileContents

    def SetDebugLogFile(self, logFileName):
        if len(logFileName) >= dcgm_structs.DCGM_PATH_LEN:
            raise ValueError(
                "Cannot set debug file to '%s' because it exceeds max length %d."
                % (logFileName, dcgm_structs.DCGM_PATH_LEN)
            )
        self.runDiagInfo.debugLogFile = logFileName

    def SetDebugLevel(self, debugLevel):
        if debugLevel < 0 or debugLevel > 5:
            raise ValueError(
                "Cannot set debug level to %d. Debug Level must be a value from 0-5 inclusive."
                % debugLevel
            )
        self.runDiagInfo.debugLevel = debugLevel

    def SetWatchFrequency(self, val):
        if val < 100000 or val > 60000000:
            raise ValueError(
                "Cannot set watch frequency to {}. Watch frequency must be a value from "
                "100000-60000000 inclusive.".format(val)
            )
        self.runDiagInfo.watchFrequency = val


def find_test_in_response(response, testName):
    count = min(response.numTests, dcgm_structs.DCGM_DIAG_RESPONSE_TESTS_MAX)
    for test in response.tests[:count]:
        if test.name == testName:
            return test
    return None


def GetEntityCount(response, entityGroupId):
    count = min(response.numEntities, dcgm_structs.DCGM_DIAG_RESPONSE_ENTITIES_MAX)
    return sum(1 for e in response.entities[:count] if e.entity.entityGroupId == entityGroupId)


def GetGpuCount(response):
    return GetEntityCount(response, dcgm_fields.DCGM_FE_GPU)


def ResultToString(result):
    return {
        dcgm_structs.DCGM_DIAG_RESULT_PASS: "Pass",
        dcgm_structs.DCGM_DIAG_RESULT_SKIP: "Skip",
        dcgm_structs.DCGM_DIAG_RESULT_WARN: "Warn",
        dcgm_structs.DCGM_DIAG_RESULT_FAIL: "Fail",
        dcgm_structs.DCGM_DIAG_RESULT_NOT_RUN: "Not Run",
    }.get(result, "Unknown")
