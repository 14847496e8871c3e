"""aggview: transactional aggregate views for key-value cloud stores."""

import os

# Local clusters fork server processes while gRPC threads run; gRPC's fork handlers are not
# needed (children exec at once) and only print warnings. Must be set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
