"""Node daemon: registration and DRA gRPC servers, prepare/unprepare, checkpoint, health."""
