# Stand-in for DCGM's Python bindings: DcgmStatus.py.
# API followed: DCGM 4.5. Not the real DCGM.
import dcgm_agent
import dcgm_structs


class DcgmStatus:
    def __init__(self):
        self.handle = dcgm_agent.dcgmStatusCreate()
        self.errors = []

    def __del__(self):
        try:
            dcgm_agent.dcgmStatusDestroy(self.handle)
        except Exception:
            pass

    def UpdateErrors(self):
        """Move the errors held by DCGM into self.errors."""
        while True:
            err = dcgm_agent.dcgmStatusPopError(self.handle)
            if err is None:
                break
            self.errors.append(err)

    def ThrowExceptionOnErrors(self):
        """Raise the DCGMError of the first error DCGM recorded, if any."""
        self.UpdateErrors()
        if not self.errors:
            return
        first = self.errors[0]
        exc = dcgm_structs.DCGMError(first.status)
        exc.SetAdditionalInfo("gpuId %d fieldId %d" % (first.gpuId, first.fieldId))
        raise exc
