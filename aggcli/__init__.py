"""The top layer: the ``aggview`` command (``aggcli.cli``), which wires every role together.
Member processes are started as ``python -m aggcli.cli`` (``aggview.processes.Server``)."""
