"""``python -m deepgap`` runs the CLI."""

from deepgap.cli import main

raise SystemExit(main())
