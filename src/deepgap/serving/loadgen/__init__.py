"""MLCommons LoadGen beside deepgap's own driver: its settings and summary, its SUTs, its trace, its table."""
