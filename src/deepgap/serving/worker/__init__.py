"""What runs in the serving worker process only: the handlers, the server, its input ring and streams."""
