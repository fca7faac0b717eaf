"""swarm_gdrive: decentralized GRPO + SAPO training of small language models over a shared folder."""

import os as _os
import sys as _sys

#: On macOS, an operation that Apple silicon's GPU (DEVICE=mps) lacks runs on the CPU rather than raising:
#: torch reads PYTORCH_ENABLE_MPS_FALLBACK once, when it is imported, so it is set here (unless the user set it)
#: and it holds only if torch was not imported before this package. policy.pick_device says which it was.
MPS_FALLBACK_SET_LATE = False
if _sys.platform == "darwin" and "PYTORCH_ENABLE_MPS_FALLBACK" not in _os.environ:
    _os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] = "1"
    MPS_FALLBACK_SET_LATE = "torch" in _sys.modules
