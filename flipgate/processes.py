"""Child processes: stopping them reliably, and finding a free local port for a server."""

import socket
import subprocess


def stop_process(process: subprocess.Popen, grace_seconds: float = 20) -> None:
    """Terminate a child process, killing it when it outlives `grace_seconds`."""
    process.terminate()
    try:
        process.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
