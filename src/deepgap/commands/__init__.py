"""Sub-commands of the ``deepgap`` CLI, one module each (discovered by `deepgap.cli`)."""
