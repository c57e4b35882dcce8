"""Serving results as views: the pandas tables, the console print-out and the report section."""
