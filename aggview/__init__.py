"""aggview: transactional aggregate views for key-value cloud stores."""

__version__ = "0.1.0"
