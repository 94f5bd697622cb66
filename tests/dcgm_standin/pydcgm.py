# Stand-in for DCGM's Python bindings: pydcgm.py (the object-oriented entry point).
# API followed: DCGM 4.5. Not the real DCGM.
import os


def _python_version_check():
    import sys  # noqa: PLC0415

    if sys.version_info[0] < 3:
        print(
            "[ERROR] Detected Python version {}. These bindings are for Python 3.5+.".format(
                sys.version.split(None, 1)[0]
            )
        )
        sys.exit(1)


_python_version_check()

# Bring the classes into this namespace, as the real module does.
from DcgmFieldGroup import *  # noqa: E402
from DcgmGroup import *  # noqa: E402
from DcgmHandle import *  # noqa: E402
from DcgmLogging import *  # noqa: E402
from DcgmStatus import *  # noqa: E402
from DcgmSystem import *  # noqa: E402

if os.environ.get("__DCGM_TESTING_FRAMEWORK_ACTIVE") == "1":
    import dcgm_structs
    import utils

    dcgm_structs._dcgmInit(utils.get_testing_framework_library_path())


class DcgmException(Exception):
    """Exception type of the pydcgm classes, distinct from Python's own."""
