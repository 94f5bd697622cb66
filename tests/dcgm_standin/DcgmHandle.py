# Stand-in for DCGM's Python bindings: DcgmHandle.py.
# API followed: DCGM 4.5. Not the real DCGM.
import dcgm_agent
import dcgm_structs
import pydcgm


class DcgmHandle:
    """A handle to DCGM: an embedded host engine or a connection to nv-hostengine."""

    def __init__(
        self,
        handle=None,
        ipAddress=None,
        opMode=dcgm_structs.DCGM_OPERATION_MODE_AUTO,
        persistAfterDisconnect=False,
        unixSocketPath=None,
        timeoutMs=0,
    ):
        """handle: an existing handle (nothing is created); ipAddress: host[:port] of
        nv-hostengine; unixSocketPath: its unix socket (exclusive with ipAddress); neither:
        start an embedded host engine in opMode. timeoutMs: connect timeout, 0 = default."""
        self._handleCreated = False
        self._persistAfterDisconnect = persistAfterDisconnect
        if handle is not None:
            self.handle = handle
            return

        self._ipAddress = ipAddress
        if ipAddress is not None and unixSocketPath is not None:
            raise dcgm_structs.dcgmExceptionClass(dcgm_structs.DCGM_ST_BADPARAM)

        dcgm_structs._dcgmInit()
        dcgm_agent.dcgmInit()

        if ipAddress is None and unixSocketPath is None:
            self.handle = dcgm_agent.dcgmStartEmbedded(opMode)
            self.isEmbedded = True
            self._handleCreated = True
            return

        params = dcgm_structs.c_dcgmConnectV2Params_v2()
        params.version = dcgm_structs.c_dcgmConnectV2Params_version
        params.timeoutMs = timeoutMs
        params.persistAfterDisconnect = 1 if self._persistAfterDisconnect else 0
        if ipAddress is not None:
            address = ipAddress
            params.addressIsUnixSocket = 0
        else:
            address = unixSocketPath
            params.addressIsUnixSocket = 1
        self.handle = dcgm_agent.dcgmConnect_v2(address, params)
        self.isEmbedded = False
        self._handleCreated = True

    def __del__(self):
        if self._handleCreated:
            self.Shutdown()

    def GetSystem(self):
        return pydcgm.DcgmSystem(self)

    def __StopDcgm__(self):
        if self.isEmbedded:
            dcgm_agent.dcgmStopEmbedded(self.handle)
        else:
            dcgm_agent.dcgmDisconnect(self.handle)

    def Shutdown(self):
        """Disconnect (or stop the embedded host engine)."""
        if not self._handleCreated:
            return
        try:
            self.__StopDcgm__()
        except AttributeError:
            # Interpreter shutdown may already have cleared the modules.
            pass
        self._handleCreated = False
        self.handle = None

    @staticmethod
    def Unload():
        dcgm_agent.dcgmShutdown()

    def GetIpAddress(self):
        return self._ipAddress
